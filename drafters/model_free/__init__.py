"""Model-free drafters: prompt lookup (`ngram`), suffix trees of the prompt and earlier outputs
(`suffix`), lookahead decoding's Jacobi rows (`lookahead`) and retrieval from a datastore
(`retrieval`); they may import `specdec.types`, `specdec.trees`, `specdec.protocols`,
`specdec.checkpoints` and `specdec.data` (the retrieval datastore)."""
