"""The target runtime: the adapter over a transformers causal LM (forwards, hidden states, exact
rollback), its caches (sliding windows enforced in their masks), the compiled engine's
fixed-shape steps, the target as the decode loop drives it (one prompt on the adapter's own cache,
several on a cache with holes), tree logits and the measured cost of a forward;
it may import `specdec.types`, `specdec.trees` and `specdec.distributed` (the ranks that hold a
sharded model)."""
