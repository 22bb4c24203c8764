"""Decoding: the one draft, verify, commit and record loop for every batch size (a prompt alone is a
run of one row), `generate` and `generate_batch` that set it up, the adapter for drafters of the
one-row protocol, adaptive k and a run's counters; it may import `specdec.types`, `specdec.trees`,
`specdec.sampling`, `specdec.processing`, `specdec.protocols`, `specdec.plugins`, `specdec.runtime`,
`specdec.distributed`, `specdec.verifier` and `specdec.teaching` (a run's trace)."""
