"""Logits -> next-token probabilities: the one pipeline used for plain decoding, `p` and `q`.

Order and semantics follow transformers' logits warpers: temperature, then top-k (ties at the
cut are kept), then top-p (the smallest set of most likely tokens whose mass reaches top_p; at
least one token kept). Temperature 0 is greedy: a one-hot distribution at the argmax.
"""

from __future__ import annotations

import torch

from specdec.types import Sampling

__all__ = ["draw", "pick", "process_logits", "probabilities", "sample"]


def process_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Apply temperature, top-k and top-p to logits [..., V]; removed entries become -inf.

    Computes in float32 at least (float64 stays float64). Not for greedy settings.
    """
    if sampling.greedy:
        raise ValueError("process_logits needs temperature > 0; greedy decoding takes the argmax")
    dtype = torch.promote_types(logits.dtype, torch.float32)
    scores = logits.to(dtype) / sampling.temperature  # (..., V)
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]  # (..., 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)  # ascending mass
        remove_sorted = cumulative <= (1.0 - sampling.top_p)
        remove_sorted[..., -1] = False  # the most likely token always stays
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Processed distribution [..., V] for logits [..., V]; one-hot at the argmax when greedy."""
    if sampling.greedy:
        dtype = torch.promote_types(logits.dtype, torch.float32)
        one_hot = torch.zeros(logits.shape, dtype=dtype, device=logits.device)
        return one_hot.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return process_logits(logits, sampling).softmax(dim=-1)


def sample(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draw one token per row of logits [n, V] -> (tokens [n], probs [n, V] or None when greedy)."""
    if sampling.greedy:
        return logits.argmax(dim=-1), None
    probs = probabilities(logits, sampling)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1), probs


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of probs [n, V] by inverting its CDF at uniforms [n] in [0, 1): tokens [n].

    The cumulative sum runs in float64, so the drawn law is the row's to ~1e-12 even over a
    150k-token vocabulary (float32 rounding alone would bias it by ~1e-3 in total variation), and
    a token of probability 0 is never drawn. Unlike `torch.multinomial` it takes its randomness
    as a tensor, so a drafter's whole draft loop can be one compiled graph.
    """
    cdf = probs.double().cumsum(dim=-1)  # (n, V)
    values = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)  # (n, 1)
    return torch.searchsorted(cdf, values, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def pick(logits: torch.Tensor, sampling: Sampling, uniforms: torch.Tensor | None
         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A drafted token per row of logits [n, V]: the argmax when greedy, else `draw` from the
    processed distribution at `uniforms` [n]. Returns (tokens [n], probs [n, V] or None)."""
    if sampling.greedy or uniforms is None:
        return logits.argmax(dim=-1), None
    probs = probabilities(logits, sampling)
    return draw(probs, uniforms), probs
