"""Prompt lookup decoding: propose the tokens that followed the latest earlier occurrence of the
context's last n tokens (Saxena 2023, "Prompt Lookup Decoding"; Yang et al. 2023, "Inference
with Reference: Lossless Acceleration of Large Language Models").

Tries n = max_ngram down to min_ngram; for the longest n with a match, takes the most recent
match that has a continuation. Deterministic: the draft is a one-hot q. An index of n-grams,
updated with each committed token, makes every lookup O(max_ngram) however long the context.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from specdec.protocols import DraftContext
from specdec.types import Draft

__all__ = ["NgramDrafter", "NgramIndex"]


class NgramIndex:
    """The latest start of every n-gram (min_n <= n <= max_n) that has a following token."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.ids: list[int] = []
        self._latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}

    def extend(self, new_ids: list[int]) -> None:
        """Append ids; n-grams that now have a continuation are indexed, later starts winning."""
        old_length = len(self.ids)
        self.ids.extend(new_ids)
        ids, last = self.ids, len(self.ids) - 1  # a start s has a continuation when s + n <= last
        for n, latest in self._latest.items():
            for start in range(max(0, old_length - n), last - n + 1):
                latest[tuple(ids[start : start + n])] = start

    def continuation(self, k: int) -> list[int]:
        """k ids copied from after the latest earlier match of the last n ids, longest n first.

        The copy may run into the ids it is producing (as in LZ77), so a match close to the end
        of a periodic context still continues the period for all k tokens.
        """
        ids = self.ids
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            start = self._latest[n].get(tuple(ids[len(ids) - n :]))
            if start is not None:
                source = ids[start + n :]  # at least one id: the match has a continuation
                return [source[i % len(source)] for i in range(k)]
        return []


class NgramDrafter:
    """Prompt lookup with n-grams of `max_ngram` down to `min_ngram` tokens."""

    name: ClassVar[str] = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        for field, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ngram: {field} must be an int >= 1, got {value!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"ngram: min_ngram ({min_ngram}) must not exceed max_ngram ({max_ngram})")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._index = NgramIndex(min_ngram, max_ngram)

    def prefill(self, ctx: DraftContext) -> None:
        self._index = NgramIndex(self.min_ngram, self.max_ngram)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        seen = len(self._index.ids)
        if ctx.tokens.shape[0] < seen:  # a new sequence without prefill: start over
            self.prefill(ctx)
            seen = 0
        self._index.extend(ctx.tokens[seen:].tolist())
        draft = self._index.continuation(k)
        return Draft(torch.tensor(draft, dtype=torch.long, device=ctx.tokens.device))
