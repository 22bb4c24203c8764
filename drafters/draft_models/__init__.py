"""Draft models: a smaller causal LM (`draft-model`, on the target's tokenizer or its own through
`translation`) and the target drafting with its own layers (`self`, with its layer view and
layer search); they may import `specdec.types`, `specdec.trees`, `specdec.sampling`,
`specdec.protocols`, `specdec.checkpoints`, `specdec.runtime`, `specdec.distributed`,
`specdec.data`, `specdec.vocab`, `specdec.drafters.shared` and `specdec.drafters.tree_search`."""
