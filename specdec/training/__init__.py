"""Training code for the zoo and `specdec train`: tokenizer, target with a joint MTP loss, and
drafters distilled from any frozen transformers causal LM."""
