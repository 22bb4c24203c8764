"""The DFlash drafter's cache: every row's context keys and values in every layer, for the committed
positions the target has processed (0 .. T - 2), and nothing else.

Block rows are never cached: a block's keys and values live for its one forward. So the cache
follows the commit by growing only: a verify commits tokens whose target hidden states reach the
drafter at the next step, and their keys and values are appended then; a rejected draft left
nothing to roll back. Column j of a row holds position j, so a row's columns past its length are
stale and hidden from its queries by `visible`.
"""

from __future__ import annotations

import torch

__all__ = ["ContextCache"]


class ContextCache:
    """Keys and values [slots, kv_heads, capacity, D] per layer, and each slot's length. A fixed
    `capacity` (a compiled generation's: every step one shape) or, without one, columns that
    grow as rows do."""

    def __init__(self, layers: int, slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, capacity: int | None = None) -> None:
        self.fixed = capacity is not None
        columns = capacity if capacity is not None else 64
        shape = (slots, kv_heads, columns, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.lengths = [0] * slots

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def append(self, slots: list[int], counts: list[int], new: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Append to slot slots[i] its first counts[i] columns of `new` (each layer's keys and values
        [len(slots), kv_heads, n, D])."""
        end = max(self.lengths[slot] + count for slot, count in zip(slots, counts))
        if end > self.capacity:
            if self.fixed:
                raise RuntimeError(f"dflash: a row's context reaches {end} positions, past its cache's {self.capacity}; "
                                   "the generation is longer than the engine sized it for")
            self._grow(max(end, 2 * self.capacity))
        for layer, (keys, values) in enumerate(new):
            for i, (slot, count) in enumerate(zip(slots, counts)):
                start = self.lengths[slot]
                self.keys[layer][slot, :, start : start + count] = keys[i, :, :count]
                self.values[layer][slot, :, start : start + count] = values[i, :, :count]
        for slot, count in zip(slots, counts):
            self.lengths[slot] += count

    def _grow(self, columns: int) -> None:
        def wider(old: torch.Tensor) -> torch.Tensor:
            grown = old.new_zeros(old.shape[0], old.shape[1], columns, old.shape[3])
            grown[:, :, : old.shape[2]] = old
            return grown

        self.keys = [wider(keys) for keys in self.keys]
        self.values = [wider(values) for values in self.values]

    def view(self, slots: list[int] | None, columns: int) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """Each layer's keys and values of `slots` (None: every slot, no copy) over the first `columns`
        columns, and which columns each holds (visible [n, columns])."""
        chosen = range(len(self.lengths)) if slots is None else slots
        device = self.keys[0].device
        lengths = torch.tensor([self.lengths[slot] for slot in chosen], device=device)
        visible = torch.arange(columns, device=device)[None] < lengths[:, None]  # (n, C)
        if slots is None:
            return ([keys[:, :, :columns] for keys in self.keys], [values[:, :, :columns] for values in self.values],
                    visible)
        index = torch.tensor(slots, device=device)
        return ([keys[index, :, :columns] for keys in self.keys], [values[index, :, :columns] for values in self.values],
                visible)
