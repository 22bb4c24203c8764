"""The `repeat` drafter: continue the periodic pattern at the end of the context.

Decoding often falls into loops: repeated list items, table rows, "ha ha ha", code with a fixed
stride, or a small model stuck in a cycle. When the last tokens repeat a pattern of period p,
this drafter proposes that the pattern goes on: d_i = tokens[T - p + (i mod p)]. It needs no
model and no earlier match in the context (unlike prompt lookup, the draft may run past the
end of the context). Deterministic: the draft carries no q (a one-hot q for the verifier).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from specdec import Capability, Draft, DraftContext

__all__ = ["RepeatDrafter", "find_period"]

_LOOKBACK = 256  # runs are measured over at most this many trailing tokens


def _check_int(field: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"repeat: {field} must be an int >= {minimum}, got {value!r}")
    return value


def find_period(tokens: torch.Tensor, max_period: int, min_repeats: int) -> int:
    """The period p <= max_period to continue, or 0 when no pattern repeats often enough.

    tokens: LongTensor [T]. run(p) is the length of the longest suffix with period p
    (tokens[i] == tokens[i - p] throughout it); p qualifies when run(p) >= p * min_repeats,
    i.e. its last p tokens occur min_repeats times in a row. Among qualifying periods the
    longest run wins (the most evidence); ties go to the shortest period.
    """
    lookback = max(_LOOKBACK, 2 * max_period * min_repeats)
    window = tokens[-lookback:].cpu()  # (W,)
    width = window.shape[0]
    best, best_run = 0, 0
    for p in range(1, min(max_period, width // min_repeats) + 1):
        mismatches = (window[p:] != window[:-p]).nonzero()  # (m, 1) positions where period p breaks
        matched = width - p if mismatches.numel() == 0 else width - p - 1 - int(mismatches[-1])
        run = p + matched
        if run >= p * min_repeats and run > best_run:
            best, best_run = p, run
    return best


class RepeatDrafter:
    """Proposes continuing the trailing pattern of period <= `max_period` seen `min_repeats` times.

    max_period: the longest pattern looked for, in tokens (default 8).
    min_repeats: how many consecutive occurrences of the pattern are needed before drafting
        (default 2; higher values draft less often but are accepted more often).
    """

    name: ClassVar[str] = "repeat"
    capabilities: ClassVar[frozenset[Capability]] = frozenset()  # no state, nothing read but the context

    def __init__(self, max_period: int = 8, min_repeats: int = 2) -> None:
        self.max_period = _check_int("max_period", max_period, 1)
        self.min_repeats = _check_int("min_repeats", min_repeats, 2)

    def propose(self, rows: Mapping[int, DraftContext], k: Mapping[int, int]) -> dict[int, Draft]:
        """Each row's continuation of its own trailing pattern (rows are independent)."""
        return {row: self.continue_pattern(ctx, k[row]) for row, ctx in rows.items()}

    def continue_pattern(self, ctx: DraftContext, k: int) -> Draft:
        """At most k tokens continuing the pattern at the end of ctx.tokens (none without one)."""
        tokens = ctx.tokens  # (T,)
        period = find_period(tokens, self.max_period, self.min_repeats) if k > 0 else 0
        if period == 0:
            return Draft(tokens[:0])
        start = tokens.shape[0] - period
        index = start + torch.arange(k, device=tokens.device) % period  # (k,)
        return Draft(tokens[index])
