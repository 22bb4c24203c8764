"""Drafters in a batch (`specdec.generate_batch`): the batched protocol, a drafter's own batched
form, and `RowDrafters`, the adapter that serves every other batch-1 drafter through it.

The batched protocol. A drafter that drafts a whole batch itself defines

    propose_batch(ctxs: dict[int, DraftContext], k: dict[int, int]) -> dict[int, Draft]

and, optionally, `prefill_batch(ctxs)` (once per generation, every row) and
`commit_batch(ctxs, num_accepted: dict[int, int])` (after each verify, the rows it drafted for).
Keys are the rows' indices in the prompt list; a call names only the rows still decoding, and
k[row] is that row's budget (at most the loop's k). Each row's DraftContext is what a batch-1
drafter sees for that row alone: its committed ids, its hidden states, its accepted nodes, its
own generator. Every draft is checked as a batch-1 draft is, and a broken one names its row.
The class-level declarations are those of the batch-1 protocol (`max_draft_nodes`,
`extra_rows`, `uses_hidden_states`, `hidden_layers`) and hold for every row.

A drafter's batched form. A batch-1 drafter may also draft batches natively without being a
batched drafter itself: `batch_form(rows) -> form | None` returns an object of the batched
protocol for `rows` rows (None when it has none for its settings), which also defines
`serves(ctx) -> bool`: whether it drafts this generation natively, judged at prefill from the
first row's context (its sampling settings, engine and tokenizer are every row's). The learned
drafters offer one: each batch step runs one batched forward per draft depth for all rows, on
a head cache with per-row holes (`specdec.runtime.batch_cache`). Where it declines, the rows
run through the adapter below; either way every row's output is its batch-1 decoding's.

The adapter. A drafter without `propose_batch` decodes each row with an instance of its own:
the drafter itself for row 0 and, for each other row, its `fork()` when it defines one (a
fresh instance sharing what is read-only or learnt across generations), else a deep copy that
shares its torch modules (weights are never copied) and re-seeds each torch.Generator it holds,
so that copies of a drafter with a random source of its own draw apart (rows of one batch
stay independent, as they are in plain sampling; builtin drafters draw from ctx.generator,
which is each row's own). Each instance sees the batch-1 protocol
unchanged: prefill, propose, commit, and `finish` when its row ends. A drafter that can be
neither forked nor copied cannot batch, and says so by name.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from specdec.protocols import DraftContext, Drafter
from specdec.types import Draft
from specdec.verifier import DraftError

__all__ = ["NativeOrRows", "RowDrafters", "batched", "fork_drafter"]


def batched(drafter: Drafter, name: str, rows: int) -> Any:
    """The batched form of `drafter` for `rows` rows: itself when it drafts batches, its own
    `batch_form` where it serves the generation, else `RowDrafters`."""
    if callable(getattr(drafter, "propose_batch", None)):
        return drafter
    method = getattr(drafter, "batch_form", None)
    form = method(rows) if callable(method) and rows > 1 else None
    return RowDrafters(drafter, name, rows) if form is None else NativeOrRows(drafter, form, name, rows)


class NativeOrRows:
    """A drafter's batched form where it serves the generation (`serves`, asked at prefill), else
    one instance per row (`RowDrafters`, made then). Exceptions of the form reach the caller as a
    DraftError naming the drafter and the method."""

    def __init__(self, drafter: Drafter, form: Any, name: str, rows: int) -> None:
        self.drafter, self.form, self.name, self.rows = drafter, form, name, rows
        self.active: Any = None
        self.seconds: dict[int, float] = {}

    @property
    def native(self) -> bool:
        """Whether this generation drafts natively (known after prefill)."""
        return self.active is self.form

    def prefill_batch(self, ctxs: dict[int, DraftContext]) -> None:
        first = ctxs[min(ctxs)]
        serves = self._call("serves", first)
        self.active = self.form if serves else RowDrafters(self.drafter, self.name, self.rows)
        self._call("prefill_batch", ctxs)

    def propose_batch(self, ctxs: dict[int, DraftContext], k: dict[int, int]) -> dict[int, Draft]:
        out = self._call("propose_batch", ctxs, k)
        self.seconds = getattr(self.active, "seconds", None) or {}
        return out

    def commit_batch(self, ctxs: dict[int, DraftContext], num_accepted: dict[int, int]) -> None:
        self._call("commit_batch", ctxs, num_accepted)

    def finish_batch(self, ctxs: dict[int, DraftContext]) -> None:
        if callable(getattr(self.active, "finish_batch", None)):
            self._call("finish_batch", ctxs)

    def _call(self, method: str, *args: Any) -> Any:
        target = self.form if self.active is None else self.active
        if target is not self.form:  # RowDrafters names the row itself
            return getattr(target, method)(*args)
        bound = getattr(target, method, None)
        if not callable(bound):
            return None
        try:
            return bound(*args)
        except (DraftError, MemoryError, torch.OutOfMemoryError):
            raise
        except Exception as error:
            raise DraftError(f"drafter {self.name!r} raised in {method} (batched): {type(error).__name__}: "
                             f"{error}") from error


def fork_drafter(drafter: Drafter, name: str, row: int) -> Drafter:
    """Another instance of `drafter` for row `row`: its `fork()`, else a deep copy sharing its
    torch modules, its generators re-seeded for the row. Raises DraftError naming the drafter
    when neither works."""
    method = getattr(drafter, "fork", None)
    try:
        twin = method() if callable(method) else copy.deepcopy(drafter, memo=_copy_memo(drafter, row))
    except Exception as error:
        how = "its fork() raised" if callable(method) else "it defines neither propose_batch nor fork(), and a copy failed"
        raise DraftError(f"drafter {name!r} cannot decode a batch: {how}: {type(error).__name__}: {error}; "
                         "give it a fork() method (a fresh instance for another row) or propose_batch "
                         "(specdec.decoding.batch_drafters)") from error
    if not callable(getattr(twin, "propose", None)):
        raise DraftError(f"drafter {name!r}: fork() returned {type(twin).__name__}, which has no propose(ctx, k)")
    return twin


def _copy_memo(root: object, row: int) -> dict[int, Any]:
    """A deepcopy memo for row `row`'s copy of `root`: every torch module reachable from its
    attributes (through objects, lists, tuples and dicts) maps to itself, so the copy shares the
    weights, and every torch.Generator to a new one seeded from the old one's seed and the row."""
    memo: dict[int, Any] = {}
    seen: set[int] = set()
    stack: list[object] = [root]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, nn.Module):
            memo[id(item)] = item
        elif isinstance(item, torch.Generator):
            fresh = torch.Generator(device=item.device)
            fresh.manual_seed((item.initial_seed() + 0x9E3779B97F4A7C15 * row) % 2**63)
            memo[id(item)] = fresh
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            stack.extend(vars(item).values())
    return memo


class RowDrafters:
    """A batch-1 drafter served to a batch: one instance per row (`fork_drafter`), each called as
    in batch-1 decoding. `seconds[row]`: each row's own drafting time in the last call."""

    def __init__(self, drafter: Drafter, name: str, rows: int) -> None:
        self.name = name
        self.drafter = drafter
        self.instances: list[Drafter] = [drafter] + [fork_drafter(drafter, name, row) for row in range(1, rows)]
        self.seconds: dict[int, float] = {}

    def prefill_batch(self, ctxs: dict[int, DraftContext]) -> None:
        self._each("prefill", ctxs)

    def propose_batch(self, ctxs: dict[int, DraftContext], k: dict[int, int]) -> dict[int, Draft]:
        return self._each("propose", ctxs, k)

    def commit_batch(self, ctxs: dict[int, DraftContext], num_accepted: dict[int, int]) -> None:
        self._each("commit", ctxs, num_accepted)

    def finish_batch(self, ctxs: dict[int, DraftContext]) -> None:
        self._each("finish", ctxs)

    def _each(self, method: str, ctxs: dict[int, DraftContext], extra: dict[int, int] | None = None) -> dict[int, Any]:
        out: dict[int, Any] = {}
        self.seconds = {}
        for row, ctx in ctxs.items():
            bound = getattr(self.instances[row], method, None)
            if not callable(bound):
                continue
            tick = time.perf_counter()
            try:
                out[row] = bound(ctx) if extra is None else bound(ctx, extra[row])
            except (DraftError, MemoryError, torch.OutOfMemoryError):  # out of memory is no drafter's fault
                raise
            except Exception as error:
                raise DraftError(f"drafter {self.name!r} raised in {method} for row {row}: "
                                 f"{type(error).__name__}: {error}") from error
            self.seconds[row] = time.perf_counter() - tick
        return out
