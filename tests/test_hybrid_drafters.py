"""The model-based drafters on a hybrid (linear-attention) target: greedy parity with
transformers and chi-square losslessness, as for attention-only targets."""

from __future__ import annotations

from pathlib import Path

import pytest

import specdec
from specdec import Sampling
from specdec.drafters.eagle import EagleDrafter, save_eagle
from specdec.drafters.medusa import MedusaDrafter, save_medusa
from test_eagle import random_head
from test_hybrid import float64_kernels, tiny_hybrid  # noqa: F401  (the fixture applies here too)
from test_lossless_statistical import ALPHA, PROMPT, VOCAB, chi_square_p_value, exact_distribution, sample_counts
from test_medusa import random_heads
from tiny import hf_greedy

HIDDEN = 32


def medusa(directory: Path, hidden: int, vocab: int, sample: bool = False) -> MedusaDrafter:
    save_medusa(random_heads(hidden=hidden, vocab=vocab, seed=4), directory)
    return MedusaDrafter(directory, sample=sample)


def eagle(directory: Path, hidden: int, vocab: int) -> EagleDrafter:
    save_eagle(random_head(seed=5, hidden=hidden, vocab=vocab), directory)
    return EagleDrafter(directory)


@pytest.mark.parametrize("make", [medusa, eagle], ids=["medusa", "eagle"])
def test_greedy_output_on_a_hybrid_target_equals_transformers(tmp_path: Path, make) -> None:
    target = tiny_hybrid(vocab_size=64, hidden=HIDDEN)
    prompt = [3, 17, 9, 3, 17, 9, 3, 17]
    result = specdec.generate(target, prompt, drafter=make(tmp_path, HIDDEN, 64), num_draft_tokens=3,
                              max_new_tokens=16)
    assert result.tokens == hf_greedy(target, prompt, 16)
    assert result.stats.drafted > 0


@pytest.mark.parametrize("make", [lambda d, h, v: medusa(d, h, v, sample=True), eagle],
                         ids=["medusa-sampled", "eagle"])
def test_sampling_on_a_hybrid_target_is_lossless(tmp_path: Path, make) -> None:
    target = tiny_hybrid(vocab_size=VOCAB, hidden=16, head_scale=8.0)
    sampling = Sampling(temperature=1.0)
    counts, drafted, accepted, deep = sample_counts(target, make(tmp_path, 16, VOCAB), sampling, runs=500)
    assert 0 < accepted < drafted and deep > 0, (drafted, accepted, deep)
    p_value = chi_square_p_value(counts, exact_distribution(target, PROMPT, sampling))
    assert p_value >= ALPHA, f"chi-square p = {p_value:.3g} on the hybrid target"
