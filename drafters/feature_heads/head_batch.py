"""A drafter head's forward over a batch (the batched forms of EAGLE, EAGLE-3 and MTP): the head's
own static cache of B rows with holes (`specdec.runtime.batch_cache.BatchCache`), each row at its
own positions and seeing only its own kept columns, so its outputs are those of the head run on
that row alone. Forwards of the usual shapes run compiled when the generation compiles: one graph
per batch size, rows and stage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from specdec.runtime.batch_cache import BatchCache
from specdec.runtime.engine import Step, step_for

__all__ = ["BatchHead", "HeadForward"]

# forward(head, cache, mask [B, 1, R, C], stage, embeds [B, R, H], features [B, R, F], positions [B, R])
#   -> (features to feed back, LM-head inputs), [B, R, H] each
HeadForward = Callable[..., tuple[torch.Tensor, torch.Tensor]]


class BatchHead:
    """`forward` of `head` on a batch cache of `rows` rows and `capacity` columns."""

    def __init__(self, head: nn.Module, forward: HeadForward, name: str, rows: int, capacity: int,
                 compile: bool) -> None:
        first = next(head.parameters())
        self.head, self.forward, self.dtype, self.name, self.compile = head, forward, first.dtype, name, compile
        self.columns = BatchCache(head, rows, capacity, first.device)
        self._step = Step(forward, f"{name}, batched", compile, head)
        self._steps: dict[tuple[Any, ...], Step] = {}

    @property
    def rows(self) -> int:
        return self.columns.rows

    @property
    def base(self) -> int:
        """The first column of the next (or last) forward."""
        return self.columns.base

    @property
    def valid(self) -> torch.Tensor:
        """BoolTensor [B, C]: the columns each batch row keeps."""
        return self.columns.valid

    def __call__(self, stage: int, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                 visible: torch.Tensor, fixed: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Run R new rows per batch row (embeds [B, R, H], features [B, R, F], positions [B, R]),
        row r of batch row b seeing that row's kept columns and the new rows visible[b, r] names
        ([B, R, R]); `fixed`: a shape of the usual steps (compiled when the generation compiles).
        The new columns are holes until `keep` names them."""
        rows = positions.shape[1]
        self.begin(rows)
        return self.run(self.forward, rows, fixed, self.mask(visible), stage, embeds, features, positions)

    def begin(self, rows: int) -> None:
        """Ready forwards of `rows` new columns in all: compact first when they would not fit."""
        self.columns.begin(rows)
        self.columns.kv.reserve(rows)

    def mask(self, visible: torch.Tensor) -> torch.Tensor:
        """The additive mask [B, 1, R, C] of R new rows written at `base`: each sees its batch row's
        kept columns and the new rows visible [B, R, R] names."""
        seen = self.columns.seen(visible)  # (B, R, C)
        mask = torch.zeros(seen.shape, dtype=self.dtype, device=seen.device)
        return mask.masked_fill_(~seen, torch.finfo(self.dtype).min)[:, None]

    def run(self, fn: Callable[..., Any], rows: int, fixed: bool, *args: Any) -> Any:
        """`fn(head, cache, *args)`, which writes `rows` columns from `base` on (after `begin`): one
        forward, or a forward and a draft loop as one step; compiled when `fixed` (a usual shape)
        and the generation compiles, one graph per function and shapes."""
        kv = self.columns.kv
        # a first write allocates the cache (never compiled); a prefill's shape varies
        if fixed and kv.initialized:
            step = self._step if fn is self.forward else \
                step_for(self._steps, fn, f"{self.name}'s batched draft", self.compile, self.head, args)
            out = step(kv.cache, *args)
        else:
            out = fn(self.head, kv.cache, *args)
        kv.advanced(rows)
        return out

    def select(self, rows: list[int]) -> None:
        """Keep the batch rows `rows` only, in that order."""
        self.columns.select(rows)
