"""A drafter head's KV cache and forward as fixed-shape steps (EAGLE, MTP): the cache is static
and sized for the generation (`ctx.engine.capacity`), and a forward given `rows` is padded to
that many rows and runs compiled when the generation compiles (`specdec.runtime.engine.Step`); the
padding is rolled back after it, unseen by the real rows, which come first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from specdec.runtime.cache import KV
from specdec.runtime.obstacles import static_obstacle
from specdec.runtime.engine import Step, fed_step, step_for
from specdec.types import Engine

__all__ = ["HeadSteps"]


class HeadSteps:
    """`head(*inputs, cache, mask)` on the head's own cache; inputs are [n, ...] tensors (the
    rows) after any leading non-tensor arguments, such as an MTP stage index."""

    def __init__(self, head: nn.Module, name: str) -> None:
        self.head, self.name = head, name
        self.kv = KV(head)
        self._compile = False
        self._where: tuple[torch.dtype | None, torch.device | None] = (None, None)  # the head's at the last reset
        self._step = Step(_head_forward, name, False, head)
        self._chains: dict[tuple[Any, ...], Step] = {}

    @property
    def length(self) -> int:
        return self.kv.length

    @property
    def cache(self) -> Any:
        return self.kv.cache

    def reset(self, engine: Engine, extra: int) -> None:
        """A cache for this generation (static when the engine sizes one), `extra` rows beyond
        the committed sequence and the verify; compiled steps when the engine compiles. Call it
        after the head has moved to the target's device and dtype."""
        capacity = engine.capacity(extra) if engine.max_length and static_obstacle(self.head) is None else None
        dtype, device = next(self.head.parameters()).dtype, next(self.head.parameters()).device
        if self.kv.fits(capacity, dtype, device):  # the same buffers: CUDA graphs captured on them replay
            self.kv.rollback(0)
        else:
            self.kv = KV(self.head, capacity)
        compile = engine.compile and self.kv.static
        if (compile, self.name, dtype, device) != (self._compile, self._step.name, *self._where):
            self._compile, self._where = compile, (dtype, device)
            self._step = Step(_head_forward, self.name, compile, self.head, restore=self._restore)
            self._chains = {}

    def width(self, rows: int) -> int:
        """Columns of a tree mask for a forward of `rows` rows."""
        return self.kv.mask_width(rows)

    def __call__(self, rows: int | None, *inputs: Any, mask: torch.Tensor | None = None) -> Any:
        """Run the head over inputs of n rows, padded to `rows` (None: eagerly, unpadded); the
        cache then holds n more entries. Returns the forward's outputs for the n real rows."""
        tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
        n = tensors[0].shape[0]
        base = self.kv.length
        self.kv.reserve(max(n, rows or 0))
        if rows is None or not self.kv.static:
            out = _head_forward(self.head, self.kv.cache, mask, *inputs)
            self.kv.advanced(n)
            return out
        padded = [_pad(x, rows) if isinstance(x, torch.Tensor) else x for x in inputs]
        if self.kv.initialized:
            out = self._step(self.kv.cache, mask, *padded)
        else:  # transformers allocates a static cache on its first write, which must not be compiled
            out = _head_forward(self.head, self.kv.cache, mask, *padded)
        self.kv.advanced(rows)
        self.kv.rollback(base + n)
        return _rows(out, n)

    def chain(self, fn: Callable[..., Any], rows: int, *args: Any, eager: bool = False) -> Any:
        """`fn(head, cache, *args)`: a drafter's draft loop, which writes `rows` entries, run as one
        step (one compiled graph per shape), e.g. k - 1 head forwards and k draws; `eager` runs it
        uncompiled (a shape met once, as at the budget's end)."""
        self.kv.reserve(rows)
        if eager or not self.kv.initialized:  # transformers allocates a static cache on its first write: never compiled
            out = fn(self.head, self.kv.cache, *args)
        else:
            step = step_for(self._chains, fn, f"{self.name}'s draft loop", self._compile, self.head, args,
                            self._restore)
            out = step(self.kv.cache, *args)
        self.kv.advanced(rows)
        return out

    def fed_chain(self, fn: Callable[..., Any], rows: int, inputs: tuple[Any, ...], chain_rows: int, *args: Any
                  ) -> Any:
        """Feed n real rows (`inputs`, as `__call__` takes them, padded to `rows`) and then run a
        draft loop `fn(head, cache, out, *args)` from the head's output `out` at the last of them
        ([1, ...] per output), which writes `chain_rows` entries: one step, one graph per shape
        when compiled, instead of a catch-up forward and a draft loop launched apart.

        Inside the step the cache is rolled back to the n real rows before the loop runs, so the
        padding is overwritten as `__call__`'s rollback would have it. A dynamic cache, or a
        static one not yet allocated (a first generation whose prefill fed nothing), takes the two
        steps, both eager: a shape met once compiles nothing."""
        n = next(x for x in inputs if isinstance(x, torch.Tensor)).shape[0]
        if not self.kv.static or not self.kv.initialized:
            return self.chain(fn, chain_rows, _last(self(rows, *inputs)), *args, eager=True)
        base = self.kv.length
        self.kv.reserve(max(n, rows) + chain_rows)
        padded = tuple(_pad(x, rows) if isinstance(x, torch.Tensor) else x for x in inputs)
        device = next(self.head.parameters()).device
        where = torch.tensor([base + n, n - 1]).to(device, non_blocking=True)  # (2,): the real length, the last row
        name = f"{self.name}'s catch-up and draft loop"
        step = step_for(self._chains, fed_step(_head_feed, fn), name, self._compile, self.head, (where, padded, *args),
                        self._restore)
        out = step(self.kv.cache, where, padded, *args)
        self.kv.advanced(n + chain_rows)
        return out

    def _restore(self) -> None:
        """Undo what a compiled step that failed may have written: the cache's length."""
        self.kv.rollback(self.kv.length)


def _head_forward(head: nn.Module, cache: Any, mask: torch.Tensor | None, *inputs: Any) -> Any:
    return head(*inputs, cache, mask)


def _head_feed(head: nn.Module, cache: Any, where: torch.Tensor, inputs: tuple[Any, ...]) -> Any:
    """`HeadSteps.fed_chain`'s feed (`fed_step`): the head over the padded rows, its output at the
    last real one (where[1])."""
    return _at(_head_forward(head, cache, None, *inputs), where[1:])


def _last(out: Any) -> Any:
    """The last row of every tensor in `out`, keeping the row dimension: [1, ...]."""
    if isinstance(out, torch.Tensor):
        return out[-1:]
    return tuple(_last(item) for item in out)


def _at(out: Any, index: torch.Tensor) -> Any:
    """Row `index` ([1]) of every tensor in `out`, keeping the row dimension: [1, ...]."""
    if isinstance(out, torch.Tensor):
        return out.index_select(0, index)
    return tuple(_at(item, index) for item in out)


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [n, ...] padded to [rows, ...] by repeating its last row (finite values, valid positions)."""
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x[-1:].expand(rows - x.shape[0], *x.shape[1:])])


def _rows(out: Any, n: int) -> Any:
    if isinstance(out, torch.Tensor):
        return out[:n]
    return tuple(_rows(item, n) for item in out)
