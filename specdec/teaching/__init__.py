"""The teaching views: the trace of a run (filled by the loop when asked), the verify probe, and
their HTML pages and terminal text; it may import `specdec.types`, `specdec.trees`,
`specdec.sampling`, `specdec.processing` and `specdec.verifier`."""
