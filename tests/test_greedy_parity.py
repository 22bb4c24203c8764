"""Greedy parity: at temperature 0 every drafter yields exactly transformers' greedy output.

Float64 tiny models, so the k+1-position verify forward and the one-token forwards of plain
decoding cannot disagree on an argmax through rounding.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import pytest
import torch
from transformers import PreTrainedModel

import specdec
from drafters_for_tests import GarbageDrafter, RandomQDrafter
from specdec import Drafter, Stats
from tiny import ARCHITECTURES, hf_greedy, tiny_model

VOCAB = 64
PROMPT = [5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14]  # repetitive: n-gram lookup drafts from step one
NEW_TOKENS = 32


@functools.lru_cache(maxsize=None)
def _target(arch: str) -> PreTrainedModel:
    return tiny_model(arch, vocab_size=VOCAB, seed=0)


@functools.lru_cache(maxsize=None)
def _reference(arch: str) -> tuple[int, ...]:
    return tuple(hf_greedy(_target(arch), PROMPT, NEW_TOKENS))


@functools.lru_cache(maxsize=None)
def _other_model(arch: str) -> PreTrainedModel:
    """A different, smaller model of the next architecture in the list, on the same vocabulary."""
    other = ARCHITECTURES[(ARCHITECTURES.index(arch) + 1) % len(ARCHITECTURES)]
    return tiny_model(other, vocab_size=VOCAB, seed=1, layers=1)


@functools.lru_cache(maxsize=None)
def _noisy_copy(arch: str) -> PreTrainedModel:
    """The target with 20% Gaussian noise on its weights: drafts that are often, not always, right."""
    model = copy.deepcopy(_target(arch))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.numel() > 1:
                noise = torch.randn(weight.shape, generator=generator, dtype=weight.dtype)
                weight.add_(0.2 * weight.std() * noise)
    return model


DRAFTERS: dict[str, Callable[[str], Drafter | None]] = {
    "plain": lambda arch: None,
    "ngram-3": lambda arch: specdec.make_drafter("ngram", max_ngram=3),
    "ngram-2to4": lambda arch: specdec.make_drafter("ngram", min_ngram=2, max_ngram=4),
    "draft-other-model": lambda arch: specdec.make_drafter("draft-model", model=_other_model(arch)),
    "draft-noisy-copy": lambda arch: specdec.make_drafter("draft-model", model=_noisy_copy(arch)),
    "draft-target-itself": lambda arch: specdec.make_drafter("draft-model", model=_target(arch)),
    "garbage": lambda arch: GarbageDrafter(seed=0),
    "random-q": lambda arch: RandomQDrafter(seed=0),
}


def assert_stats_consistent(stats: Stats, tokens: list[int], k: int) -> None:
    """Counters of a run without EOS agree with each other and with the emitted tokens."""
    assert stats.steps >= 1
    assert stats.new_tokens == len(tokens)
    assert stats.new_tokens == stats.steps + stats.accepted, "each step emits its accepted drafts plus one"
    assert 0 <= stats.accepted <= stats.drafted
    assert 1.0 <= stats.mean_accepted_length <= k + 1
    assert sum(stats.accepted_per_position) == stats.accepted
    assert sum(stats.drafted_per_position) == stats.drafted
    for position, (accepted, drafted) in enumerate(zip(stats.accepted_per_position, stats.drafted_per_position)):
        assert accepted <= drafted, f"position {position}: {accepted} accepted of {drafted} drafted"
    pairs = list(zip(stats.accepted_per_position, stats.accepted_per_position[1:]))
    assert all(a >= b for a, b in pairs), f"accepted_per_position rises: {stats.accepted_per_position}"
    pairs = list(zip(stats.drafted_per_position, stats.drafted_per_position[1:]))
    assert all(a >= b for a, b in pairs), f"drafted_per_position rises: {stats.drafted_per_position}"


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("drafter_name", list(DRAFTERS))
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_output_equals_transformers_greedy(arch: str, drafter_name: str, k: int) -> None:
    drafter = DRAFTERS[drafter_name](arch)
    result = specdec.generate(_target(arch), PROMPT, drafter=drafter, num_draft_tokens=k,
                              max_new_tokens=NEW_TOKENS, seed=0)
    expected = list(_reference(arch))
    differences = [i for i, (a, b) in enumerate(zip(result.tokens, expected)) if a != b]
    assert result.tokens == expected, (
        f"{arch}, drafter {drafter_name}, k={k}: {len(result.tokens)} tokens, first difference at new token "
        f"{differences[0] if differences else min(len(result.tokens), len(expected))}"
    )
    stats = result.stats
    assert_stats_consistent(stats, result.tokens, k)
    if drafter is None:
        assert stats.drafted == 0 and stats.steps == NEW_TOKENS
    if drafter_name.startswith("ngram"):
        assert stats.drafted > 0, "the repetitive prompt must make n-gram lookup draft"
    if drafter_name == "draft-target-itself":
        assert stats.accepted == stats.drafted > 0, "the target drafting for itself is always right"
        assert stats.steps == -(-NEW_TOKENS // (k + 1)), "every step emits k + 1 tokens"
