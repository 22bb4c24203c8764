"""Training for the zoo and `specdec train`: a tokenizer, a target with a joint MTP loss, and
drafters distilled from any frozen transformers causal LM; it may import `specdec.types`,
`specdec.trees`, `specdec.protocols`, `specdec.plugins`, `specdec.checkpoints`, `specdec.staging`,
`specdec.data`, `specdec.decoding` (the acceptance estimate), `specdec.distributed`,
`specdec.drafters`, `specdec.runtime` and `specdec.vocab` (the tokenizer's
byte tokens, for a free mask id)."""
