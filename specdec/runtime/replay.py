"""Rolling back a hybrid model on a dynamic cache (a Mamba2 hybrid such as Bamba; a Qwen3-Next given
no capacity), whose recurrent state is a running sum that no crop can undo. (On the static cache
GatedDeltaNet layers keep every row's state instead: `specdec.runtime.linear`.)

Each forward first snapshots the recurrent state (`snapshot`, fixed size)
and keeps the ids it feeds; a rollback restores the latest snapshot at or before the new length,
then replays the ids from there to that length in one forward (none when the snapshot is exactly
there). The adapter (`specdec.runtime.target.CausalLM`) keeps one `Replay` per hybrid model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers.cache_utils import Cache, LinearAttentionCacheLayerMixin

from specdec.runtime.cache import KV, cache_length, crop_cache

__all__ = ["Replay", "Snapshot", "restore", "snapshot"]


@dataclass(frozen=True)
class Snapshot:
    """The cache's length and, per linear-attention layer and state index, a copy of the
    recurrent state (None where the layer had not run yet)."""

    length: int
    states: dict[tuple[int, int], torch.Tensor | None]


def snapshot(cache: Cache) -> Snapshot:
    """Copy the recurrent states (fixed size: [1, heads, d_k, d_v] per layer) and the length."""
    states: dict[tuple[int, int], torch.Tensor | None] = {}
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            for i in range(layer.number_of_states):
                if not layer.has_previous_state[i]:
                    states[index, i] = None
                elif layer.is_recurrent_states_initialized[i]:  # conv-only layers crop exactly
                    states[index, i] = cast(torch.Tensor, layer.recurrent_states[i]).clone()
    return Snapshot(cache_length(cache), states)


def restore(cache: Cache, saved: Snapshot) -> None:
    """Put the cache back as it was when `saved` was taken, in place.

    Attention layers and conv states are cropped; recurrent states are copied back, and a layer
    that had not run yet forgets its state.
    """
    crop_cache(cache, saved.length)
    for (index, i), state in saved.states.items():
        layer = cast(Any, cache.layers[index])
        if state is not None:
            layer.recurrent_states[i].copy_(state)
        elif layer.has_previous_state[i]:
            LinearAttentionCacheLayerMixin.reset(layer)  # the linear part only; the next forward starts afresh


class Replay:
    """The snapshots taken by the forwards since the last rollback or reset, and the ids each fed."""

    def __init__(self) -> None:
        self._snapshots: list[tuple[Snapshot, torch.Tensor]] = []  # (state before a forward, ids it fed)

    def record(self, cache: Cache, input_ids: torch.Tensor) -> None:
        """Before a forward feeds input_ids [n]: keep the state and the ids (cloned: callers reuse
        their buffers)."""
        self._snapshots.append((snapshot(cache), input_ids.clone()))

    def clear(self) -> None:
        self._snapshots = []

    def rollback(self, kv: KV, length: int, feed: Callable[[torch.Tensor], None]) -> None:
        """Put `kv` back at `length` positions: restore a snapshot, then `feed` the ids between it
        and `length` (one forward, appended to the cache). Only positions fed since the last
        rollback or reset can be reached."""
        current = kv.length
        starts = [saved.length for saved, _ in self._snapshots]
        if not 0 <= length <= current or not starts or length < starts[0]:
            raise ValueError(f"cannot roll back a cache of {current} positions to {length}: a hybrid model "
                             f"rolls back only to positions {starts[0] if starts else current}..{current} "
                             "fed since the last rollback or reset")
        index = max(i for i, start in enumerate(starts) if start <= length)
        saved = self._snapshots[index][0]
        restore(kv.cache, saved)
        kv.length = saved.length
        if length > saved.length:
            fed = torch.cat([ids for _, ids in self._snapshots[index:]])  # ids from saved.length on
            feed(fed[: length - saved.length])
