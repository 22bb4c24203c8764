"""Parallel drafters: drafters that propose a whole block in one forward — DFlash's block stack
over the target's injected hidden states, and PARD's draft model over mask tokens — each split
into its module, its checkpoint files and its drafter; they may import `specdec.types`,
`specdec.sampling`, `specdec.protocols`, `specdec.checkpoints`, `specdec.staging`,
`specdec.runtime`, `specdec.drafters.shared`, `specdec.drafters.tree_search` and
`specdec.drafters.draft_models`."""
