"""The penalties: pure functions of scores [R, V] and the counts of the ids in each row's prefix,
one row per verify position, tree node or drafted position.

Each follows a published rule: the presence and frequency penalties as the OpenAI API states
them; the repetition penalty as transformers' `RepetitionPenaltyLogitsProcessor` (Keskar et al.
2019, CTRL, section 4.1).
"""

from __future__ import annotations

import torch

__all__ = ["penalize_counts", "penalize_repeats", "prefix_counts"]


def prefix_counts(base: torch.Tensor, suffixes: torch.Tensor) -> torch.Tensor:
    """How often each id occurs in each row's prefix: base [V] (the committed part every row
    shares) plus the row's own suffix, suffixes [R, L] padded with -1 -> counts [R, V] (float32)."""
    rows, vocab = suffixes.shape[0], base.shape[0]
    counts = base.to(torch.float32).expand(rows, vocab).clone()  # (R, V)
    if suffixes.shape[1]:
        real = suffixes >= 0  # (R, L)
        counts.scatter_add_(1, suffixes.clamp(min=0), real.to(torch.float32))
    return counts


def penalize_repeats(scores: torch.Tensor, counts: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers' repetition penalty: at every id the row's prefix holds (counts [R, V] > 0), a
    logit l becomes l * penalty when l < 0 and l / penalty otherwise."""
    penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(counts > 0, penalized, scores)


def penalize_counts(scores: torch.Tensor, counts: torch.Tensor, presence: float, frequency: float) -> torch.Tensor:
    """The OpenAI presence and frequency penalties: l - frequency * count - presence * (count > 0),
    counts [R, V] of the generated ids only."""
    return scores - frequency * counts - presence * (counts > 0).to(scores.dtype)
