"""Drafters in a batch (`specdec.generate_batch`): the batched protocol, and `RowDrafters`, the
adapter that serves every batch-1 drafter through it.

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

__all__ = ["RowDrafters", "batched", "fork_drafter"]


def batched(drafter: Drafter, name: str, rows: int) -> Any:
    """The batched form of `drafter` for `rows` rows: itself when it drafts batches, else `RowDrafters`."""
    if callable(getattr(drafter, "propose_batch", None)):
        return drafter
    return RowDrafters(drafter, name, rows)


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
