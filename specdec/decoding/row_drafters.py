"""Drafters of the earlier, one-row protocol (`specdec.protocols.RowDrafter`: `propose(ctx, k) ->
Draft`) served as `Drafter`s: `RowDrafters`, one instance per row.

Row 0 is the drafter itself; each other row gets its `fork()` when it defines one (a fresh
instance sharing what is read-only or learnt across generations), else a deep copy that shares
its torch modules (weights are never copied) and re-seeds each torch.Generator it holds, so that
copies of a drafter with a random source of its own draw apart (rows stay independent, as they
are in plain sampling; well-behaved drafters draw from ctx.generator, which is each row's own).
Each instance sees the one-row protocol unchanged: prefill, propose, commit, and `finish` when
its row ends. A drafter that can be neither forked nor copied cannot draft a batch, and says so.

This module is the one place where a drafter's methods are found by name: the earlier protocol
declared nothing, so the adapter reads what the drafter has once and declares it
(`Capability`) on its behalf.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from specdec.protocols import Capability, Rows
from specdec.runtime.forward import LAST_LAYER
from specdec.runtime.target import CausalLM
from specdec.types import Draft
from specdec.verifier import DraftError

__all__ = ["RowDrafters", "fork_drafter"]


class RowDrafters:
    """A drafter of the one-row protocol as a `Drafter`: one instance per row, made as rows appear."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset()  # the class's; each adapter declares its own

    def __init__(self, drafter: Any, name: str) -> None:
        self.drafter, self.name = drafter, name
        self.instances: dict[int, Any] = {}
        self.capabilities = frozenset(_found(drafter))  # type: ignore[misc]

    def instance(self, row: int) -> Any:
        """Row `row`'s instance: the drafter itself for row 0, else its fork or copy."""
        if row not in self.instances:
            self.instances[row] = self.drafter if row == 0 else fork_drafter(self.drafter, self.name, row)
        return self.instances[row]

    def propose(self, rows: Rows, k: Mapping[int, int]) -> dict[int, Draft]:
        self._make(rows)
        return {row: self._call(row, "propose", ctx, k[row]) for row, ctx in rows.items()}

    def prefill(self, rows: Rows) -> None:
        self._make(rows)
        self._each("prefill", rows)

    def _make(self, rows: Rows) -> None:
        """Every new row's instance, made before any row's instance is called this time."""
        for row in sorted(rows):
            self.instance(row)

    def commit(self, rows: Rows, accepted: Mapping[int, int]) -> None:
        for row, ctx in rows.items():
            if callable(getattr(self.instance(row), "commit", None)):
                self._call(row, "commit", ctx, accepted[row])

    def finish(self, rows: Rows) -> None:
        self._each("finish", rows)

    def forget(self) -> None:
        for instance in {id(x): x for x in [self.drafter, *self.instances.values()]}.values():
            method = getattr(instance, "forget", None)
            if callable(method):
                method()

    def hidden_layers(self, target: CausalLM) -> tuple[int, ...]:
        method = getattr(self.drafter, "hidden_layers", None)
        return tuple(method(target)) if callable(method) else (LAST_LAYER,)

    def max_draft_nodes(self, k: int) -> Any:
        return self.drafter.max_draft_nodes(k)

    def extra_rows(self) -> Any:
        return self.drafter.extra_rows()

    def cache_length(self, row: int) -> int | None:
        length = getattr(self.instance(row), "cache_length", None)
        return length if isinstance(length, int) and not isinstance(length, bool) else None

    def _each(self, method: str, rows: Rows) -> None:
        for row, ctx in rows.items():
            if callable(getattr(self.instance(row), method, None)):
                self._call(row, method, ctx)

    def _call(self, row: int, method: str, *args: Any) -> Any:
        """Row `row`'s instance's `method`; what it raises comes back as a DraftError naming the drafter,
        the method and, in a batch, the row."""
        try:
            return getattr(self.instance(row), method)(*args)
        except (DraftError, MemoryError, torch.OutOfMemoryError):  # out of memory is no drafter's fault
            raise
        except Exception as error:
            where = f" for row {row}" if len(self.instances) > 1 else ""
            raise DraftError(f"drafter {self.name!r} raised in {method}{where}: {type(error).__name__}: "
                             f"{error}") from error

    def __getattr__(self, name: str) -> Any:  # the drafter's own attributes (its options, `history`, ...)
        if name == "drafter":
            raise AttributeError(name)
        return getattr(self.drafter, name)


def _found(drafter: Any) -> list[Capability]:
    """The capabilities an earlier-protocol drafter has, by the methods it defines."""
    has = {name for name in ("prefill", "commit", "finish", "forget", "hidden_layers", "max_draft_nodes",
                             "extra_rows") if callable(getattr(drafter, name, None))}
    found = []
    if has & {"prefill", "commit"}:
        found.append(Capability.STATE)
    if has & {"finish", "forget"}:
        found.append(Capability.LEARNS)
    if "hidden_layers" in has or getattr(drafter, "uses_hidden_states", False):
        found.append(Capability.HIDDEN_STATES)
    if "max_draft_nodes" in has:
        found.append(Capability.TREES)
    if "extra_rows" in has:
        found.append(Capability.EXTRA_ROWS)
    length = getattr(drafter, "cache_length", None)
    if isinstance(length, int) and not isinstance(length, bool):
        found.append(Capability.CACHE_LENGTH)
    return found


def fork_drafter(drafter: Any, name: str, row: int) -> Any:
    """Another instance of `drafter` for row `row`: its `fork()`, else a deep copy sharing its
    torch modules, its generators re-seeded for the row. Raises DraftError naming the drafter
    when neither works."""
    method = getattr(drafter, "fork", None)
    try:
        twin = method() if callable(method) else copy.deepcopy(drafter, memo=_copy_memo(drafter, row))
    except Exception as error:
        how = "its fork() raised" if callable(method) else "it defines no fork(), and a copy failed"
        raise DraftError(f"drafter {name!r} cannot decode a batch: {how}: {type(error).__name__}: {error}; "
                         "give it a fork() method (a fresh instance for another row), or implement "
                         "specdec.Drafter (every row at once)") from error
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
