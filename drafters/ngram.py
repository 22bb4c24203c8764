"""Prompt lookup decoding: propose the tokens that followed the latest earlier occurrence of the
context's last n tokens (Saxena 2023, "Prompt Lookup Decoding"; Yang et al. 2023, "Inference
with Reference: Lossless Acceleration of Large Language Models").

Tries n = max_ngram down to min_ngram; for the longest n with a match, takes the most recent
match that has a continuation. Deterministic: the draft is a one-hot q.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from specdec.protocols import DraftContext
from specdec.types import Draft

__all__ = ["NgramDrafter", "find_continuation"]


def find_continuation(tokens: torch.Tensor, max_ngram: int, min_ngram: int, k: int) -> torch.Tensor:
    """Up to k ids following the latest earlier match of the last n ids, longest n first.

    tokens: LongTensor [T]. Returns LongTensor [k'] (k' = 0 when nothing matches).
    """
    length = tokens.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = tokens[length - n :]  # (n,)
        windows = tokens[: length - 1].unfold(0, n, 1)  # (T-n, n): starts 0..T-n-1, each followed by a token
        hits = (windows == tail).all(dim=1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n  # the most recent match's continuation
            return tokens[start : min(start + k, length)]
    return tokens[:0]


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

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        return Draft(find_continuation(ctx.tokens, self.max_ngram, self.min_ngram, k))
