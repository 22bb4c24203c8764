"""Logits -> next-token probabilities for the settings that read no prefix: the one pipeline's
stateless part, used for plain decoding, `p` and `q` whenever `Sampling.reads_prefix` is False
(penalties, processors and constraints need each row's prefix: `specdec.processing.Pipeline`).

Order and semantics follow transformers: the logit bias and single-id bans, then its logits
warpers: temperature, top-k (ties at the cut are kept), top-p (the smallest set of most likely
tokens whose mass reaches top_p; at least one token kept), min-p. Temperature 0 is greedy: a
one-hot distribution at the argmax of the biased logits. Min-p as transformers'
`MinPLogitsWarper` (Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling"); the bias as the
OpenAI API's `logit_bias`.
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.types import Sampling

__all__ = ["PrefixPicker", "RowsPicker", "add_bias", "apply_min_p", "banned_ids", "chain_sampling", "draw", "greedy_ids", "pick", "process_logits", "probabilities", "sample", "stateless_scores", "warp"]


def add_bias(scores: torch.Tensor, ids: torch.Tensor, biases: torch.Tensor) -> torch.Tensor:
    """scores [R, V] with biases [b] added at ids [b] (a -inf bias bans the id)."""
    return scores.index_add(-1, ids, biases.to(scores.dtype).expand(scores.shape[0], -1))


def apply_min_p(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop (-inf) the ids whose probability is below min_p times the row's largest; the most
    likely id always stays. scores [R, V] after temperature, top-k and top-p."""
    probs = scores.softmax(dim=-1)  # (R, V)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    remove.scatter_(-1, probs.argmax(dim=-1, keepdim=True), False)
    return scores.masked_fill(remove, float("-inf"))


def banned_ids(sampling: Sampling) -> list[int]:
    """The ids `bad_words_ids` bans whatever the prefix (its one-id words)."""
    return sorted({word[0] for word in sampling.bad_words_ids if len(word) == 1})


def stateless_scores(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The logit bias and the single-id bans of logits [..., V], in float32 at least (float64 stays)."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    scores = logits.to(dtype)
    if sampling.logit_bias:
        flat = scores.reshape(-1, scores.shape[-1])
        ids = torch.tensor([t for t, _ in sampling.logit_bias], dtype=torch.long, device=scores.device)
        biases = torch.tensor([b for _, b in sampling.logit_bias], dtype=dtype, device=scores.device)
        scores = add_bias(flat, ids, biases).reshape(scores.shape)
    banned = banned_ids(sampling)
    if banned:
        scores = scores.index_fill(-1, torch.tensor(banned, device=scores.device), float("-inf"))
    return scores


def warp(scores: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """transformers' warpers in its order: temperature, top-k, top-p, min-p; scores [..., V] ->
    removed entries -inf. Not for greedy settings."""
    if sampling.greedy:
        raise ValueError("warp needs temperature > 0; greedy decoding takes the argmax")
    scores = scores / sampling.temperature  # (..., V)
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
    if sampling.min_p > 0.0:
        scores = apply_min_p(scores, sampling.min_p)
    return scores


def _stateless(sampling: Sampling) -> None:
    if sampling.reads_prefix:
        raise ValueError("these settings read each row's prefix (penalties, no_repeat_ngram_size, bad words of "
                         "several ids, logits processors or a constraint): process the logits with the run's "
                         "specdec.processing.Pipeline (a drafter: ctx.probabilities)")


def process_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The bias, the bans and the warpers of logits [..., V]; removed entries become -inf.

    Computes in float32 at least (float64 stays float64). Not for greedy settings, nor for
    settings that read the prefix.
    """
    _stateless(sampling)
    return warp(stateless_scores(logits, sampling), sampling)


def probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Processed distribution [..., V] for logits [..., V]; one-hot at the argmax when greedy."""
    _stateless(sampling)
    if sampling.greedy:
        scores = stateless_scores(logits, sampling) if not sampling.plain else logits
        dtype = torch.promote_types(logits.dtype, torch.float32)
        one_hot = torch.zeros(logits.shape, dtype=dtype, device=logits.device)
        return one_hot.scatter_(-1, scores.argmax(dim=-1, keepdim=True), 1.0)
    return process_logits(logits, sampling).softmax(dim=-1)


def greedy_ids(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The greedy ids of logits [..., V]: the argmax after the bias and the bans."""
    _stateless(sampling)
    return (stateless_scores(logits, sampling) if not sampling.plain else logits).argmax(dim=-1)


def sample(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draw one token per row of logits [n, V] -> (tokens [n], probs [n, V] or None when greedy)."""
    if sampling.greedy:
        return greedy_ids(logits, sampling), None
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


class PrefixPicker:
    """A drafter's chain draws when the settings read the prefix (penalties, processors, a
    constraint): the token at each position from q processed as the verifier processes p there,
    from the committed ids plus the tokens drafted before it (`DraftContext.probabilities`), on
    the host. Passed to `pick` in place of the Sampling; one per draft (it remembers the draft)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.drafted: list[int] = []

    @property
    def greedy(self) -> bool:
        return bool(self.ctx.sampling.greedy)

    def __call__(self, logits: torch.Tensor, uniforms: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One token for logits [1, V] at uniforms [1] -> (token [1], q [1, V] or None when greedy)."""
        if self.greedy or uniforms is None:
            token, probs = self.ctx.greedy_ids(logits, [self.drafted]), None
        else:
            probs = self.ctx.probabilities(logits, [self.drafted])
            token = draw(probs, uniforms)
        self.drafted.append(int(token[0]))
        return token, probs


class RowsPicker:
    """The chain draws of several batch rows at once when the settings read the prefix: slot s's
    token from its own `PrefixPicker` (its row's prefix, on the host); slots without one (idle)
    take the argmax. Passed to `pick` in place of the Sampling, one per draft."""

    def __init__(self, pickers: dict[int, PrefixPicker]) -> None:
        self.pickers = pickers

    @property
    def greedy(self) -> bool:
        return all(picker.greedy for picker in self.pickers.values())

    def __call__(self, logits: torch.Tensor, uniforms: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens [B] for logits [B, V] at uniforms [B] -> (tokens [B], q [B, V] or None when greedy)."""
        tokens = logits.argmax(dim=-1)  # (B,)
        probs: torch.Tensor | None = None
        for slot, picker in self.pickers.items():
            token, q = picker(logits[slot : slot + 1], None if uniforms is None else uniforms[slot : slot + 1])
            tokens[slot] = token[0]
            if q is not None:
                probs = torch.zeros(logits.shape, dtype=q.dtype, device=q.device) if probs is None else probs
                probs[slot] = q[0]
        return tokens, probs


def chain_sampling(ctx: Any) -> Sampling | PrefixPicker:
    """What a drafter's chain loop passes to `pick`: the settings, or a `PrefixPicker` when they
    read the prefix (the loop then runs step by step on the host, never as a compiled step)."""
    return PrefixPicker(ctx) if ctx.sampling.reads_prefix else ctx.sampling


def pick(logits: torch.Tensor, sampling: Sampling | PrefixPicker | RowsPicker, uniforms: torch.Tensor | None
         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A drafted token per row of logits [n, V]: the argmax when greedy, else `draw` from the
    processed distribution at `uniforms` [n]. Returns (tokens [n], probs [n, V] or None). With a
    `PrefixPicker` (one row) or a `RowsPicker` (a row's per batch row), each row's draw from its
    own prefix."""
    if isinstance(sampling, (PrefixPicker, RowsPicker)):
        return sampling(logits, uniforms)
    if sampling.greedy or uniforms is None:
        return greedy_ids(logits, sampling), None
    probs = probabilities(logits, sampling)
    return draw(probs, uniforms), probs
