"""The model-based drafters on a hybrid (linear-attention) target: greedy parity with
transformers and chi-square losslessness, as for attention-only targets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import specdec
from specdec import Sampling
from specdec.drafters.feature_heads.eagle import EagleDrafter, save_eagle
from specdec.drafters.feature_heads.medusa import MedusaDrafter
from specdec.drafters.feature_heads.medusa_files import save_medusa
from specdec.drafters.feature_heads.mtp import MtpDrafter
from specdec.drafters.model_free.ngram import NgramDrafter
from specdec.drafters.parallel.dflash import DFlashDrafter
from specdec.drafters.parallel.dflash_files import save_dflash
from test_dflash import dflash_head
from test_eagle import random_head
from test_hybrid import float64_kernels, tiny_hybrid  # noqa: F401  (the fixture applies here too)
from test_lossless_statistical import ALPHA, PROMPT, VOCAB, chi_square_p_value, exact_distribution, sample_counts
from test_medusa import random_heads
from test_mtp import mtp_tensors, write_target
from tiny import hf_greedy

HIDDEN = 32


def medusa(directory: Path, hidden: int, vocab: int, sample: bool = False) -> MedusaDrafter:
    save_medusa(random_heads(hidden=hidden, vocab=vocab, seed=4), directory)
    return MedusaDrafter(directory, sample=sample)


def eagle(directory: Path, hidden: int, vocab: int) -> EagleDrafter:
    save_eagle(random_head(seed=5, hidden=hidden, vocab=vocab), directory)
    return EagleDrafter(directory)


def mtp(directory: Path, target: torch.nn.Module, sample: bool = False) -> MtpDrafter:
    """The hybrid target saved with a random Qwen3-Next-layout MTP module (`mtp.*`)."""
    return MtpDrafter(write_target(target, mtp_tensors(target, "qwen", seed=6), directory), sample=sample)


def dflash(directory: Path, hidden: int, vocab: int, **options: object) -> DFlashDrafter:
    """A random DFlash drafter reading the hybrid target's first two layers' outputs (linear, full)."""
    save_dflash(dflash_head(vocab=vocab, hidden=hidden, layers=1, block=4, layer_ids=(0, 1), seed=7), directory)
    return DFlashDrafter(directory, **options)


GREEDY = {
    "dflash": lambda directory, target: dflash(directory, HIDDEN, 64),
    "dflash+ddtree": lambda directory, target: dflash(directory, HIDDEN, 64, tree=True, top_k=2, total_tokens=6),
    "medusa": lambda directory, target: medusa(directory, HIDDEN, 64),
    "eagle": lambda directory, target: eagle(directory, HIDDEN, 64),
    "mtp": lambda directory, target: mtp(directory, target),
}


@pytest.mark.parametrize("name", list(GREEDY))
def test_greedy_output_on_a_hybrid_target_equals_transformers(tmp_path: Path, name: str) -> None:
    target = tiny_hybrid(vocab_size=64, hidden=HIDDEN)
    prompt = [3, 17, 9, 3, 17, 9, 3, 17]
    result = specdec.generate(target, prompt, drafter=GREEDY[name](tmp_path, target), num_draft_tokens=3,
                              max_new_tokens=16)
    assert result.tokens == hf_greedy(target, prompt, 16)
    assert result.stats.drafted > 0


SAMPLED = {
    "ngram": lambda directory, target: NgramDrafter(max_ngram=3),
    "medusa-sampled": lambda directory, target: medusa(directory, 16, VOCAB, sample=True),
    "eagle": lambda directory, target: eagle(directory, 16, VOCAB),
    "mtp-sampled": lambda directory, target: mtp(directory, target, sample=True),
    "dflash": lambda directory, target: dflash(directory, 16, VOCAB),
}


@pytest.mark.parametrize("name", list(SAMPLED))
def test_sampling_on_a_hybrid_target_is_lossless(tmp_path: Path, name: str) -> None:
    target = tiny_hybrid(vocab_size=VOCAB, hidden=16, head_scale=8.0)
    sampling = Sampling(temperature=1.0)
    counts, drafted, accepted, deep = sample_counts(target, SAMPLED[name](tmp_path, target), sampling, runs=500)
    assert 0 < accepted < drafted and deep > 0, (drafted, accepted, deep)
    p_value = chi_square_p_value(counts, exact_distribution(target, PROMPT, sampling))
    assert p_value >= ALPHA, f"chi-square p = {p_value:.3g} on the hybrid target"
