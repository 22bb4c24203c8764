"""The benchmarks: every drafter and transformers' own decoding side by side on one target
(Spec-Bench protocol), the batch curve, the synthetic-target bench, and their reports and plots;
it may import `specdec.types`, `specdec.intervals`, `specdec.protocols`, `specdec.plugins`, `specdec.checkpoints`, `specdec.gguf`,
`specdec.errors`, `specdec.versions`, `specdec.data`, `specdec.decoding`, `specdec.runtime`,
`specdec.distributed`, `specdec.drafters`, `specdec.training`, `specdec.zoo` (its drafters) and
`specdec.verifier` (the names of its rules)."""
