"""Distributed ranks: the process group a sharded target runs in, the broadcast that keeps every
rank on rank 0's draft and verdict, and the packing of those into one tensor each; it may import
`specdec.types`."""
