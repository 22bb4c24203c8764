"""Plain sampling written without specdec, the reference the sampling settings' tests compare with:
transformers' own logits processors over each whole prefix (the OpenAI penalties, which
transformers lacks, by their rule), a grammar's mask from a fresh xgrammar matcher that parses
the generated ids from the start, and the exact law of a short continuation by enumeration."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specdec import Sampling

__all__ = ["FreshGrammarMask", "plain_law", "transformers_processors", "word_tokenizer"]


class FreshGrammarMask(LogitsProcessor):
    """The grammar's mask after the generated ids (those past `prompt_length`), from a new matcher
    that parses them from the start."""

    def __init__(self, compiled: Any, prompt_length: int) -> None:
        self.compiled, self.prompt_length = compiled, prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        import xgrammar

        vocab = scores.shape[-1]
        matcher = xgrammar.GrammarMatcher(self.compiled)
        for token in input_ids[0, self.prompt_length :].tolist():
            assert matcher.accept_token(token), f"the reference walked outside the grammar at id {token}"
        bitmask = xgrammar.allocate_token_bitmask(1, vocab)
        matcher.fill_next_token_bitmask(bitmask)
        words = bitmask[0].tolist()
        allowed = torch.tensor([(words[t // 32] >> (t % 32)) & 1 for t in range(vocab)], dtype=torch.bool)
        return scores.masked_fill(~allowed.to(scores.device), float("-inf"))


def transformers_processors(s: Sampling, prompt_length: int, compiled: Any = None) -> LogitsProcessorList:
    """transformers' own list for the shared settings, in `generate`'s order, the OpenAI penalties
    beside the repetition penalty, a grammar's mask (`compiled`, for a constrained `s`) before the
    warpers."""

    class OpenAIPenalties(LogitsProcessor):
        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            counts = torch.zeros_like(scores)
            counts.scatter_add_(1, input_ids[:, prompt_length:], torch.ones_like(input_ids[:, prompt_length:],
                                                                                 dtype=scores.dtype))
            return scores - s.frequency_penalty * counts - s.presence_penalty * (counts > 0).to(scores.dtype)

    out = LogitsProcessorList()
    if s.logit_bias:
        out.append(SequenceBiasLogitsProcessor({(token,): bias for token, bias in s.logit_bias}))
    if s.repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(s.repetition_penalty))
    if s.presence_penalty or s.frequency_penalty:
        out.append(OpenAIPenalties())
    if s.no_repeat_ngram_size:
        out.append(NoRepeatNGramLogitsProcessor(s.no_repeat_ngram_size))
    if s.bad_words_ids:
        out.append(NoBadWordsLogitsProcessor([list(w) for w in s.bad_words_ids]))
    out.extend(s.logits_processors)
    if s.constraint is not None:
        assert compiled is not None, "a constrained setting needs the compiled grammar"
        out.append(FreshGrammarMask(compiled, prompt_length))
    if not s.greedy:
        out.append(TemperatureLogitsWarper(float(s.temperature)))
        if s.top_k:
            out.append(TopKLogitsWarper(s.top_k))
        if s.top_p < 1.0:
            out.append(TopPLogitsWarper(s.top_p))
        if s.min_p:
            out.append(MinPLogitsWarper(s.min_p))
    return out


def plain_law(logits: Callable[[tuple[int, ...]], torch.Tensor], prompt: Sequence[int], s: Sampling, length: int,
              compiled: Any = None, stop: int | None = None, generated: Sequence[int] = ()
              ) -> dict[tuple[int, ...], float]:
    """P(output) of plain sampling: `length` new ids after `prompt` and the ids already `generated`,
    or fewer ending at `stop`. `logits(ids)` gives the raw next-id logits [V] after the id tuple."""
    processors = transformers_processors(s, len(prompt), compiled)
    law: dict[tuple[int, ...], float] = {}

    def walk(output: tuple[int, ...], weight: float) -> None:
        if len(output) == length or (stop is not None and output and output[-1] == stop):
            law[output] = law.get(output, 0.0) + weight
            return
        ids = tuple(prompt) + tuple(generated) + output
        scores = processors(torch.tensor([ids]), logits(ids)[None].clone())
        for token, w in enumerate(scores.softmax(-1)[0].tolist()):
            if w > 0:
                walk(output + (token,), weight * w)

    walk((), 1.0)
    return law


def word_tokenizer(words: Sequence[str]) -> Any:
    """A word-level tokenizer whose id i is words[i] and whose end token is "</s>" (one of the words):
    a vocabulary small enough to enumerate, which the grammar engine reads as raw strings."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="</s>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
