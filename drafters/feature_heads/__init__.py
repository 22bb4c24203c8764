"""Feature heads: drafters that read the target's hidden states through heads of their own —
Medusa's heads, EAGLE-1's and EAGLE-3's feature-level layer, the target's own MTP modules — each
split into its module, its checkpoint files and its drafter, with the steps and batched forms they
share; they may import `specdec.types`, `specdec.trees`, `specdec.sampling`, `specdec.protocols`,
`specdec.checkpoints`, `specdec.runtime`, `specdec.drafters.shared` and
`specdec.drafters.tree_search`."""
