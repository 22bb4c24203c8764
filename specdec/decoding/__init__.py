"""Decoding: the draft, verify, accept and roll-back loop for one prompt and for a batch, the
`generate` and `generate_batch` that set them up, adaptive k and a run's counters; it may import
`specdec.types`, `specdec.trees`, `specdec.sampling`, `specdec.processing`, `specdec.protocols`, `specdec.plugins`,
`specdec.runtime`, `specdec.distributed`, `specdec.verifier` and `specdec.teaching` (a run's trace)."""
