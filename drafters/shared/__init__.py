"""What the learned drafters' chains share (a draft model's, the feature heads'): the usual chain's
length, uniforms and cut (`chains`) and the batched chain loop with its padded catch-ups
(`batch_chains`); they may import `specdec.types`, `specdec.sampling` and `specdec.protocols`."""
