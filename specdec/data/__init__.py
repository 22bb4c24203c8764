"""The text specdec reads: training corpora, held-out code prompts, chat templates and the
retrieval datastore built from a corpus; it may import `specdec.checkpoints` and `specdec.staging`."""
