"""Adaptive draft length: transformers' "heuristic" schedule for assisted generation (raise the
draft length by 2 after a draft is accepted whole, lower it by 1 after any rejection), as a
wrapper around any drafter, so any drafter can run with `k=auto`."""

from __future__ import annotations

from typing import Any

from specdec.protocols import DraftContext, Drafter
from specdec.trees import depths
from specdec.types import Draft

__all__ = ["AdaptiveDraftLength"]


class AdaptiveDraftLength:
    """Proposes `k_t` tokens from `inner`, with k_t in [1, the loop's k], adapted after each verify.

    Run it with `generate(..., num_draft_tokens=K_MAX)`: K_MAX caps the draft length. For a tree
    drafter k_t is the tree's depth, and "accepted whole" means a path down to that depth.
    """

    def __init__(self, inner: Drafter, start: int = 4) -> None:
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            raise ValueError(f"k=auto: the starting draft length must be an int >= 1, got {start!r}")
        self.inner = inner
        self.name = f"{getattr(inner, 'name', type(inner).__name__)}:k=auto"
        self.uses_hidden_states = bool(getattr(inner, "uses_hidden_states", False))
        self.start = start
        self.k = start
        self._proposed = 0
        self._draft: Draft | None = None
        self.history: list[int] = []  # the draft length (a tree's depth) proposed at each verified step
        self.requested: list[int] = []  # the draft length asked of the inner drafter at each step

    def prefill(self, ctx: DraftContext) -> None:
        self.k = self.start
        self.history, self.requested = [], []
        if hasattr(self.inner, "prefill"):
            self.inner.prefill(ctx)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        length = max(1, min(self.k, k))
        self.requested.append(length)
        draft = self.inner.propose(ctx, length)
        self._draft = draft  # its length is read in commit, after the loop has validated it
        return draft

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        draft, self._draft = self._draft, None
        if draft is None:
            self._proposed = 0
        elif draft.parents is None:
            self._proposed = int(draft.tokens.shape[0])
        else:  # a tree's length is its depth
            self._proposed = max(depths(draft.parents.tolist()), default=0)
        self.history.append(self._proposed)
        if self._proposed:  # an empty draft says nothing about the right length
            self.k = self.k + 2 if num_accepted == self._proposed else max(1, self.k - 1)
        if hasattr(self.inner, "commit"):
            self.inner.commit(ctx, num_accepted)

    def __getattr__(self, name: str) -> Any:  # cache_length and other drafter attributes
        return getattr(self.inner, name)
