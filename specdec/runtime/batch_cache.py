"""A static cache of a batch with holes: the column bookkeeping that the batched target
(`specdec.runtime.batch_target.BatchLM`) and the drafters' batched heads share.

Every forward writes its R new columns at one shared column, `width`, for all B rows. Each row
then keeps the columns it names (`keep`) and leaves the others as holes that no later query
attends to: a validity mask [B, C] is folded into every forward's mask (`seen`). A row may also
keep columns for a while and give them back (`release`): a drafter's draft entries, seen by the
row's later draft steps and by nothing after its verify. Nothing moves in the attention layers
after a forward; when the columns run out, `compact` moves each row's kept columns to the front,
in order (one gather per layer), and `select` keeps some rows only (the others finished).
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.runtime.cache import KV

__all__ = ["BatchCache"]


class BatchCache:
    """`rows` batch rows of a static cache of `capacity` columns for `owner` (a model, or a
    drafter head: anything whose `.config` describes its layers), and which columns each row keeps."""

    def __init__(self, owner: Any, rows: int, capacity: int, device: torch.device) -> None:
        self.kv = KV(owner, capacity)  # kv.length: the columns written (`width`)
        self.capacity, self.rows = capacity, rows
        self.valid = torch.zeros(rows, capacity, dtype=torch.bool, device=device)  # (B, C) kept columns
        self.base = 0  # the first column of the last forward

    @property
    def width(self) -> int:
        """Columns written so far (kept or holes)."""
        return self.kv.length

    def kept(self) -> torch.Tensor:
        """LongTensor [B]: the columns each row keeps."""
        return self.valid.sum(dim=1)

    def begin(self, rows: int) -> None:
        """Ready a forward of `rows` new columns: compact when they would run past the capacity;
        the forward's columns start at `base`."""
        if self.width + rows > self.capacity:
            self.compact()
        if self.width + rows > self.capacity:
            raise ValueError(f"a batched forward of {rows} rows overflows a cache of {self.capacity} columns whose "
                             f"rows keep up to {self.width}; size it for the whole generation")
        self.base = self.width

    def seen(self, visible: torch.Tensor) -> torch.Tensor:
        """The columns each new row sees [B, R, C]: its row's kept columns, and among the R new
        ones (written at `base`) those `visible` [B, R, R] names."""
        batch, rows = visible.shape[:2]
        seen = self.valid[:, None, :].expand(batch, rows, self.capacity).clone()  # (B, R, C)
        seen[:, :, self.base : self.base + rows] = visible
        return seen

    def keep(self, rows: list[int], columns: list[int]) -> None:
        """Row rows[i] keeps the new column base + columns[i] of the last forward."""
        self._mark(rows, [self.base + column for column in columns], True)

    def keep_new(self, real: torch.Tensor) -> None:
        """Each row keeps the new columns of the last forward that real [B, R] marks (a padded
        forward's real rows), all at once on the device."""
        self.valid[:, self.base : self.base + real.shape[1]] |= real

    def release(self, rows: list[int], columns: list[int]) -> None:
        """Row rows[i] gives back column columns[i] (absolute, as `width` counts): a hole from now on."""
        self._mark(rows, columns, False)

    def _mark(self, rows: list[int], columns: list[int], value: bool) -> None:
        if rows:
            where = torch.tensor([rows, columns], dtype=torch.long).to(self.valid.device)  # (2, n)
            self.valid[where[0], where[1]] = value

    def compact(self) -> None:
        """Move every row's kept columns to the front of its columns, in order; the holes go."""
        order = torch.argsort((~self.valid).to(torch.uint8), dim=1, stable=True)  # (B, C): kept columns first
        self.kv.reorder(order)
        kept = self.kept()  # (B,)
        self.valid = torch.arange(self.capacity, device=self.valid.device)[None] < kept[:, None]
        self.kv.rebase(int(kept.max()) if kept.numel() else 0)
        self.base = self.width

    def select(self, rows: list[int]) -> None:
        """Keep only the batch rows `rows`, in that order (the others finished)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.valid.device)
        self.kv.select(index)  # layers not written yet (or another pipeline stage's) keep no rows to select
        self.valid = self.valid.index_select(0, index)
        self.rows = len(rows)
