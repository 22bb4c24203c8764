"""Speculative decoding samples whole continuations from exactly plain sampling's distribution.

For a tiny float64 model with a small vocabulary V, the exact law of a 3-token continuation
(V**3 outcomes) is enumerated with the model's own forward and the shared sampling pipeline.
`specdec.generate(..., seed=i)` for i < N gives empirical counts, compared with a Pearson
chi-square test after pooling cells whose expected count is below 5. The false-alarm rate is
ALPHA = 1e-4 and the seeds are fixed, so a red run means a bug, not bad luck. A deliberately
lossy verifier must fail the same test (the test has power).
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import PreTrainedModel

import specdec
from specdec import Sampling
from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.sampling import probabilities

from drafters_for_tests import GarbageDrafter, RandomQDrafter
from tiny import tiny_model

ALPHA = 1e-4  # false-alarm rate of every test here
RUNS = 800  # N: generations per case (~10 ms each on CPU)
VOCAB = 5  # V: V**3 = 125 continuations
LENGTH = 3  # new tokens per generation
NUM_DRAFT = 3  # k; with 3 new tokens the first chain has depth min(k, 3 - 1) = 2
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # repetitive, so prompt lookup finds matches
MODEL = dict(vocab_size=VOCAB, layers=1, hidden=16, head_scale=8.0)  # peaked, not degenerate

PLAIN = Sampling(temperature=1.0)
TRUNCATED = Sampling(temperature=0.7, top_k=4, top_p=0.9)


@pytest.fixture(scope="module")
def target() -> PreTrainedModel:
    return tiny_model(seed=0, **MODEL)


@pytest.fixture(scope="module")
def other_model() -> PreTrainedModel:
    return tiny_model(seed=1, **MODEL)


def exact_distribution(model: PreTrainedModel, prompt: list[int], sampling: Sampling) -> np.ndarray:
    """P(x1, x2, x3 | prompt) under plain sampling, flattened [V**3] (index x1*V*V + x2*V + x3)."""
    vocab = int(model.config.vocab_size)
    pairs = torch.cartesian_prod(torch.arange(vocab), torch.arange(vocab))  # (V*V, 2)
    ids = torch.cat([torch.tensor(prompt).expand(vocab * vocab, -1), pairs], dim=1)  # (V*V, T+2)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits  # (V*V, T+2, V)
    p = probabilities(logits[:, len(prompt) - 1 :], sampling).double()  # (V*V, 3, V)
    first = p[0, 0]  # (V,) every row shares the prompt
    second = p[::vocab, 1]  # (V, V): row x1
    third = p[:, 2].reshape(vocab, vocab, vocab)  # (V, V, V): [x1, x2]
    joint = first[:, None, None] * second[:, :, None] * third  # (V, V, V)
    return joint.flatten().numpy()


def pooled(observed: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge cells with expected count < 5, smallest first, into groups of expected >= 5."""
    large = expected >= 5
    groups_observed, groups_expected = list(observed[large]), list(expected[large])
    order = np.argsort(expected[~large], kind="stable")
    group_observed = group_expected = 0.0
    for cell_observed, cell_expected in zip(observed[~large][order], expected[~large][order]):
        group_observed += cell_observed
        group_expected += cell_expected
        if group_expected >= 5:
            groups_observed.append(group_observed)
            groups_expected.append(group_expected)
            group_observed = group_expected = 0.0
    if group_expected > 0:  # a thin remainder joins the smallest group
        smallest = int(np.argmin(groups_expected))
        groups_observed[smallest] += group_observed
        groups_expected[smallest] += group_expected
    return np.array(groups_observed), np.array(groups_expected)


def chi_square_p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square p-value of counts [C] against probs [C], after pooling thin cells.

    Outcomes of probability 0 must never be observed; that is asserted, not tested.
    """
    assert abs(probs.sum() - 1.0) < 1e-9, f"the enumerated probabilities sum to {probs.sum()!r}"
    impossible = probs == 0
    assert counts[impossible].sum() == 0, (
        f"sampled continuations of probability 0: cells {np.flatnonzero(impossible & (counts > 0)).tolist()}"
    )
    observed, expected = pooled(counts[~impossible].astype(float), counts.sum() * probs[~impossible])
    expected *= observed.sum() / expected.sum()  # remove float rounding of sum(probs) - 1
    return float(chisquare(observed, expected).pvalue)


def sample_counts(model: PreTrainedModel, drafter: object, sampling: Sampling,
                  runs: int = RUNS, compile: bool = False) -> tuple[np.ndarray, int, int, int]:
    """Counts [V**3] of N generated continuations, and total drafted / accepted / deep chains."""
    outcomes: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = deep = 0
    for seed in range(runs):
        result = specdec.generate(model, PROMPT, drafter=drafter, num_draft_tokens=NUM_DRAFT,
                                  max_new_tokens=LENGTH, sampling=sampling, seed=seed, compile=compile)
        assert len(result.tokens) == LENGTH, f"seed {seed}: got {result.tokens}, expected {LENGTH} tokens"
        outcomes[tuple(result.tokens)] += 1
        drafted += result.stats.drafted
        accepted += result.stats.accepted
        deep += result.stats.drafted_per_position[1] if NUM_DRAFT > 1 else 0
    counts = np.zeros(VOCAB**LENGTH, dtype=np.int64)
    for (x1, x2, x3), count in outcomes.items():
        counts[(x1 * VOCAB + x2) * VOCAB + x3] = count
    return counts, drafted, accepted, deep


DRAFTERS: dict[str, Callable[[PreTrainedModel, PreTrainedModel], object]] = {
    "ngram": lambda target, other: NgramDrafter(max_ngram=3),
    "draft-model": lambda target, other: DraftModelDrafter(other),
    "draft-model-is-target": lambda target, other: DraftModelDrafter(target),
    "random-q": lambda target, other: RandomQDrafter(seed=12345),
    "garbage": lambda target, other: GarbageDrafter(seed=12345),
}


@pytest.mark.parametrize("sampling", [PLAIN, TRUNCATED], ids=["t1", "t0.7-k4-p0.9"])
def test_plain_sampling_matches_enumerated_distribution(target, sampling):
    counts, drafted, _, _ = sample_counts(target, None, sampling)
    assert drafted == 0
    p_value = chi_square_p_value(counts, exact_distribution(target, PROMPT, sampling))
    assert p_value >= ALPHA, f"plain sampling ({sampling}) deviates from enumeration: p = {p_value:.3g}"


@pytest.mark.parametrize(
    ("drafter_key", "sampling"),
    [
        pytest.param("ngram", PLAIN, id="ngram-t1"),
        pytest.param("draft-model", TRUNCATED, id="draft-model-t0.7-k4-p0.9"),
        pytest.param("draft-model-is-target", PLAIN, id="draft-model-is-target-t1"),
        pytest.param("random-q", TRUNCATED, id="random-q-t0.7-k4-p0.9"),
        pytest.param("garbage", TRUNCATED, id="garbage-t0.7-k4-p0.9"),
    ],
)
def test_speculative_continuations_match_plain_sampling(target, other_model, drafter_key, sampling):
    drafter = DRAFTERS[drafter_key](target, other_model)
    counts, drafted, accepted, deep = sample_counts(target, drafter, sampling)
    assert drafted > 0 and accepted > 0 and deep > 0, (
        f"{drafter_key}: drafted {drafted}, accepted {accepted}, depth-2 chains {deep}: the case is vacuous"
    )
    if drafter_key == "draft-model-is-target":  # q == p: every draft token is accepted
        assert accepted >= 0.99 * drafted, f"q == p but only {accepted} of {drafted} drafts accepted"
    else:
        assert accepted < drafted, f"{drafter_key}: no draft token was ever rejected ({drafted} drafted)"
    p_value = chi_square_p_value(counts, exact_distribution(target, PROMPT, sampling))
    assert p_value >= ALPHA, f"{drafter_key} ({sampling}) is not lossless: chi-square p = {p_value:.3g}"


def accept_every_draft(p: torch.Tensor, tokens: torch.Tensor, q: torch.Tensor | None,
                       generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, None, None]:
    """Lossy: keep the whole draft, then a bonus token from p[k] (in `chain_verdict`'s form)."""
    k = tokens.shape[0]
    bonus = torch.multinomial(p[k], 1, generator=generator)
    return torch.tensor(k), torch.cat([tokens, bonus]), None, None


def correct_from_p(p: torch.Tensor, tokens: torch.Tensor, q: torch.Tensor | None,
                   generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, None, None]:
    """Lossy: the usual acceptance test, but the correction is drawn from p, not the residual."""
    k = tokens.shape[0]
    if k == 0:
        return torch.tensor(0), torch.multinomial(p[0], 1, generator=generator), None, None
    assert q is not None, "correct_from_p serves sampled drafts only"
    index = tokens[:, None]  # (k, 1)
    accept = (p[:k].gather(-1, index) / q.gather(-1, index)).squeeze(-1).clamp(max=1.0)  # (k,)
    uniforms = torch.rand(k, generator=generator, dtype=p.dtype)
    n = int((uniforms < accept).cumprod(0).sum())
    last = torch.multinomial(p[n], 1, generator=generator)
    return torch.tensor(n), torch.cat([tokens[:n], last, tokens[n + 1 :]]), None, None


@pytest.mark.parametrize(
    ("lossy", "drafter_key"),
    [
        pytest.param(accept_every_draft, "random-q", id="accept-every-draft"),
        pytest.param(correct_from_p, "draft-model", id="correction-from-p-not-residual"),
    ],
)
def test_chi_square_detects_a_lossy_verifier(target, other_model, monkeypatch, lossy, drafter_key):
    rules = importlib.import_module("specdec.verifier.rules")
    monkeypatch.setattr(rules, "chain_verdict", lossy)  # whichever chain rule the run uses
    monkeypatch.setattr(rules, "block_verdict", lossy)
    # twice the runs of the lossless tests: the test must have power to spare, whatever the random stream
    counts, drafted, _, _ = sample_counts(target, DRAFTERS[drafter_key](target, other_model), PLAIN, runs=2 * RUNS)
    assert drafted > 0
    p_value = chi_square_p_value(counts, exact_distribution(target, PROMPT, PLAIN))
    assert p_value < ALPHA, (
        f"{lossy.__name__} with {drafter_key} went undetected: p = {p_value:.3g}, N = {2 * RUNS}"
    )
