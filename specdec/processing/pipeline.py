"""The pipeline of one generation (one row of a batch): logits of any rows -> their processed
scores and distributions, each row from its own prefix (`specdec.processing.prefixes`).

Where each step runs: the logit bias, the penalties (counts of each row's prefix, one scatter),
min-p and the warpers are tensor operations over all rows at once, on the model's device; bad
words, `no_repeat_ngram_size`, the user's logits processors and a constraint's mask are computed
on the host one row at a time, from that row's prefix (a grammar's matcher advances over the
committed ids once and walks the draft's rows by accepting and rolling back tokens, never
re-parsing from the start). None of it runs inside a compiled graph: the compiled engine's
graphs end at the logits.
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.processing.penalties import penalize_counts, penalize_repeats, prefix_counts
from specdec.processing.prefixes import Prefixes
from specdec.sampling import add_bias, banned_ids, stateless_scores, warp
from specdec.types import Sampling

__all__ = ["Pipeline", "ProcessorError"]


class ProcessorError(RuntimeError):
    """A logits processor of `Sampling.logits_processors` raised or returned what is not scores."""


class Pipeline:
    """Sampling settings bound to a generation: its vocabulary, where its prompt ends, and its
    constraint's matcher (None without a constraint; `specdec.processing.constraint`)."""

    def __init__(self, sampling: Sampling, vocab_size: int, prompt_length: int, matcher: Any = None) -> None:
        self.sampling = sampling
        self.vocab_size = vocab_size
        self.prompt_length = prompt_length
        self.matcher = matcher
        self._bias: tuple[torch.Tensor, torch.Tensor] | None = None
        self._host: list[Any] | None = None  # transformers' processors of the host steps, built on first use
        self._check_ids([token for token, _ in sampling.logit_bias], "logit_bias")
        self._check_ids([i for word in sampling.bad_words_ids for i in word], "bad_words_ids")

    @property
    def reads_prefix(self) -> bool:
        return self.sampling.reads_prefix

    def scores(self, logits: torch.Tensor, prefixes: Prefixes | None) -> torch.Tensor:
        """Every step before the warpers, in the order `specdec.processing` states: logits [R, V]
        -> scores [R, V] in float32 at least (float64 stays float64). `prefixes` (each row's) may
        be None only for settings that read no prefix."""
        s = self.sampling
        if prefixes is None:
            if s.reads_prefix:
                raise ValueError("these sampling settings read each row's prefix; none was given")
            return stateless_scores(logits, s)
        dtype = torch.promote_types(logits.dtype, torch.float32)
        scores = logits.to(dtype)
        if s.logit_bias:
            ids, biases = self._biases(scores.device)
            scores = add_bias(scores, ids, biases)
        if s.repetition_penalty != 1.0:
            counts = prefix_counts(torch.bincount(prefixes.committed, minlength=self.vocab_size)[: self.vocab_size],
                                   prefixes.suffixes)
            scores = penalize_repeats(scores, counts, s.repetition_penalty)
        if s.presence_penalty != 0.0 or s.frequency_penalty != 0.0:
            generated = prefixes.committed[self.prompt_length :]
            counts = prefix_counts(torch.bincount(generated, minlength=self.vocab_size)[: self.vocab_size],
                                   prefixes.suffixes)
            scores = penalize_counts(scores, counts, s.presence_penalty, s.frequency_penalty)
        banned = banned_ids(s)
        if banned:
            scores = scores.index_fill(-1, torch.tensor(banned, device=scores.device), float("-inf"))
        if self._host_processors():
            scores = self._host_steps(scores, prefixes)
        if self.matcher is not None:
            allowed = self.matcher.masks(prefixes)  # (R, V) bool on the host
            scores = scores.masked_fill(~allowed.to(scores.device), float("-inf"))
        return scores

    def probabilities(self, logits: torch.Tensor, prefixes: Prefixes | None, *, draft: bool = False) -> torch.Tensor:
        """The distributions [R, V]: one-hot at the processed argmax when greedy, else the
        warped scores' softmax. `draft`: a drafter's q (`_drafter_scores`)."""
        scores = self.scores(logits, prefixes)
        if draft:
            scores = _drafter_scores(scores, logits)
        if self.sampling.greedy:
            one_hot = torch.zeros(scores.shape, dtype=scores.dtype, device=scores.device)
            return one_hot.scatter_(-1, scores.argmax(dim=-1, keepdim=True), 1.0)
        return warp(scores, self.sampling).softmax(dim=-1)

    def argmax(self, logits: torch.Tensor, prefixes: Prefixes | None, *, draft: bool = False) -> torch.Tensor:
        """Greedy ids [R]: the argmax of each row's processed scores (`draft`: a drafter's)."""
        scores = self.scores(logits, prefixes)
        return (_drafter_scores(scores, logits) if draft else scores).argmax(dim=-1)

    def commit(self, tokens: list[int]) -> None:
        """The ids just committed (the constraint's matcher advances over them)."""
        if self.matcher is not None:
            self.matcher.advance(tokens)

    def _biases(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._bias is None or self._bias[0].device != device:
            ids = torch.tensor([t for t, _ in self.sampling.logit_bias], dtype=torch.long, device=device)
            biases = torch.tensor([b for _, b in self.sampling.logit_bias], dtype=torch.float64, device=device)
            self._bias = (ids, biases)
        return self._bias

    def _check_ids(self, ids: list[int], field: str) -> None:
        outside = sorted(i for i in ids if i >= self.vocab_size)
        if outside:
            raise ValueError(f"Sampling.{field} names ids {outside[:5]} outside the target's vocabulary "
                             f"[0, {self.vocab_size})")

    def _host_processors(self) -> list[Any]:
        """transformers' own processors for repeated n-grams and bad words of several ids, then the
        user's: the steps that walk each row's prefix on the host."""
        if self._host is None:
            from transformers import NoBadWordsLogitsProcessor, NoRepeatNGramLogitsProcessor

            s, host = self.sampling, []
            if s.no_repeat_ngram_size:
                host.append(NoRepeatNGramLogitsProcessor(s.no_repeat_ngram_size))
            words = [list(w) for w in s.bad_words_ids if len(w) > 1]
            if words:
                host.append(NoBadWordsLogitsProcessor(words))
            self._host = host + list(s.logits_processors)
        return self._host

    def _host_steps(self, scores: torch.Tensor, prefixes: Prefixes) -> torch.Tensor:
        """Each row through the host processors with its whole prefix, as transformers calls them."""
        processors = self._host_processors()
        rows = []
        for r in range(scores.shape[0]):
            ids, row = prefixes.ids(r), scores[r : r + 1]  # (1, L), (1, V)
            for processor in processors:
                row = _call(processor, ids, row)
            rows.append(row)
        return torch.cat(rows)


def _drafter_scores(scores: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """A drafter's rows: where the settings leave a row no id (a grammar allowing none of the ids
    a drafter's smaller vocabulary holds, its other logits -inf), the row's raw logits instead.
    Any q keeps the verifier exact as long as the draft is drawn from it; those draws get p = 0
    and are rejected, where a row of no mass would have no distribution to draw from."""
    empty = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (R, 1)
    return torch.where(empty, logits.to(scores.dtype), scores)


def _call(processor: Any, ids: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    name = getattr(type(processor), "__name__", repr(processor))
    try:
        out = processor(ids, row)
    except Exception as error:
        raise ProcessorError(f"logits processor {name} raised {type(error).__name__}: {error}") from error
    if not isinstance(out, torch.Tensor) or out.shape != row.shape or not out.is_floating_point():
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ProcessorError(f"logits processor {name} returned {shape} for scores of shape {tuple(row.shape)}: a "
                             "processor returns float scores of the shape it was given")
    return out.to(row.dtype)
