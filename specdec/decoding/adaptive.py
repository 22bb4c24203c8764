"""Adaptive draft length: transformers' "heuristic" schedule for assisted generation (raise the
draft length by 2 after a draft is accepted whole, lower it by 1 after any rejection), as a
wrapper around any drafter, so any drafter can run with `k=auto`. Each row keeps its own length."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from specdec.protocols import Capability, Drafter, Rows, declares, forget, is_rows_drafter
from specdec.trees import depths
from specdec.types import Draft

__all__ = ["AdaptiveDraftLength"]


class AdaptiveDraftLength:
    """Proposes `k_t` tokens per row from `inner`, with k_t in [1, the loop's k], adapted after each verify.

    Run it with `generate(..., num_draft_tokens=K_MAX)`: K_MAX caps the draft length. For a tree
    drafter k_t is the tree's depth, and "accepted whole" means a path down to that depth.
    `history` and `requested` record row 0's proposed and requested lengths, step by step.
    """

    capabilities: ClassVar[frozenset[Capability]] = frozenset()  # the class's; each wrapper declares its own

    def __init__(self, inner: Drafter | Any, start: int = 4) -> None:
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            raise ValueError(f"k=auto: the starting draft length must be an int >= 1, got {start!r}")
        if not is_rows_drafter(inner):
            from specdec.decoding.row_drafters import RowDrafters

            inner = RowDrafters(inner, str(getattr(inner, "name", type(inner).__name__)))
        self.inner = inner
        self.name = f"{getattr(inner, 'name', type(inner).__name__)}:k=auto"
        # it rolls each row's length after each verify, whatever the inner drafter declares
        self.capabilities = frozenset(inner.capabilities) | {Capability.STATE}  # type: ignore[misc]
        self.start = start
        self._k: dict[int, int] = {}
        self._drafts: dict[int, Draft] = {}
        self.history: list[int] = []  # row 0: the draft length (a tree's depth) proposed at each verified step
        self.requested: list[int] = []  # row 0: the draft length asked of the inner drafter at each step

    def prefill(self, rows: Rows) -> None:
        self._k = dict.fromkeys(rows, self.start)
        self._drafts = {}
        self.history, self.requested = [], []
        if declares(self.inner, Capability.STATE):
            self.inner.prefill(rows)  # type: ignore[attr-defined]

    def propose(self, rows: Rows, k: Mapping[int, int]) -> Mapping[int, Draft]:
        lengths = {row: max(1, min(self._k.get(row, self.start), k[row])) for row in rows}
        if 0 in lengths:
            self.requested.append(lengths[0])
        drafts = self.inner.propose(rows, lengths)
        self._drafts = dict(drafts)  # their lengths are read in commit, after the loop has checked them
        return drafts

    def commit(self, rows: Rows, accepted: Mapping[int, int]) -> None:
        for row in rows:
            draft = self._drafts.pop(row, None)
            if draft is None:
                proposed = 0
            elif draft.parents is None:
                proposed = int(draft.tokens.shape[0])
            else:  # a tree's length is its depth
                proposed = max(depths(draft.parents.tolist()), default=0)
            if row == 0:
                self.history.append(proposed)
            if proposed:  # an empty draft says nothing about the right length
                k = self._k.get(row, self.start)
                self._k[row] = k + 2 if accepted[row] == proposed else max(1, k - 1)
        if declares(self.inner, Capability.STATE):
            self.inner.commit(rows, accepted)  # type: ignore[attr-defined]

    def forget(self) -> None:
        forget(self.inner)

    def __getattr__(self, name: str) -> Any:  # the inner drafter's declared methods and attributes
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
