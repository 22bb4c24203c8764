"""The verifier is lossless: exact closed forms over its pure pieces, and properties of its verdicts.

One step emits d with probability q(d) a(d), else a draw from the residual r_d, so
    P(out = x) = sum_d q(d) [a(d) 1{x = d} + (1 - a(d)) r_d(x)],
which must equal p(x) for sampled drafts (d ~ q) and for every deterministic draft (q one-hot).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from specdec.sampling import probabilities
from specdec.verifier import acceptance_probabilities, residual_distribution, verify_chain, verify_greedy
from strategies import (
    ChainCase,
    chain_drafts,
    distribution_pairs,
    logits,
    probability_vectors,
    samplings,
    vocab_sizes,
)

EXACT = dict(rtol=0.0, atol=1e-9)
FALSE_ALARM = 1e-4


def one_hot(token: int, vocab_size: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token), vocab_size).to(torch.float64)


def step_given_draft(p: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """Distribution [V] of the token emitted at one position once draft `token` is proposed."""
    d = torch.tensor(token)
    a = acceptance_probabilities(p[None], None if q is None else q[None], d[None])[0]
    return a * one_hot(token, p.shape[0]) + (1 - a) * residual_distribution(p, q, d)


def sampled_step(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P(out = x) for d ~ q; p, q: [V]."""
    support = q.nonzero().flatten().tolist()
    return sum(q[d] * step_given_draft(p, q, d) for d in support)


def assert_distribution_equals(actual: torch.Tensor, p: torch.Tensor, context: str) -> None:
    torch.testing.assert_close(actual, p, **EXACT, msg=lambda m: f"{context}\np={p}\nout={actual}\n{m}")


# --- one step, closed form -----------------------------------------------------------------------

@settings(max_examples=200)
@given(distribution_pairs())
def test_one_step_with_sampled_draft_outputs_p(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    p, q = pair
    assert_distribution_equals(sampled_step(p, q), p, f"q={q}")


@settings(max_examples=200)
@given(st.data())
def test_one_step_with_any_deterministic_draft_outputs_p(data: st.DataObject) -> None:
    p = data.draw(probability_vectors(data.draw(vocab_sizes())))
    for d in range(p.shape[0]):
        assert_distribution_equals(step_given_draft(p, None, d), p, f"deterministic draft d={d}")
        # a one-hot q passed explicitly is the same draft
        assert_distribution_equals(step_given_draft(p, one_hot(d, p.shape[0]), d), p, f"one-hot q at d={d}")


@settings(max_examples=150)
@given(st.data())
def test_one_step_outputs_p_through_the_sampling_pipeline(data: st.DataObject) -> None:
    vocab_size = data.draw(vocab_sizes())
    sampling = data.draw(samplings())
    p = probabilities(data.draw(logits(vocab_size)), sampling)  # (V,)
    q = probabilities(data.draw(logits(vocab_size)), sampling)  # (V,)
    assert_distribution_equals(sampled_step(p, q), p, f"{sampling}, sampled q={q}")
    for d in range(vocab_size):
        assert_distribution_equals(step_given_draft(p, None, d), p, f"{sampling}, deterministic d={d}")


# --- two positions, closed form --------------------------------------------------------------------

@st.composite
def two_position_models(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    """p1 [V], p2 [V, V] (row x: target after x), q1 [V], q2 [V, V] (row d: drafter after d)."""
    vocab_size = draw(st.integers(2, 5))
    p1, q1 = (draw(probability_vectors(vocab_size)) for _ in range(2))
    p2, q2 = (torch.stack([draw(probability_vectors(vocab_size)) for _ in range(vocab_size)])
              for _ in range(2))
    return p1, p2, q1, q2


def first_two_tokens(p1: torch.Tensor, p2: torch.Tensor, q1: torch.Tensor | None, q2: torch.Tensor | None,
                     drafts: list[tuple[int, ...]], weights: list[float]) -> torch.Tensor:
    """Joint P(x1, x2) [V, V] of the first two emitted tokens over chain drafts of equal length.

    Mirrors verify_chain: row i of the verifier's p is the target after the accepted prefix, the
    bonus row after all of it; after a rejection at position 1 the next step emits from p2[x1]
    (one-step exactness, checked above).
    """
    vocab_size = p1.shape[0]
    joint = torch.zeros(vocab_size, vocab_size, dtype=torch.float64)
    for draft, weight in zip(drafts, weights):
        d1 = draft[0]
        p = torch.stack([p1, p2[d1]])  # (2, V): verifier rows at draft positions 1, 2
        q = None if q1 is None else torch.stack([q1, q2[d1]])  # (2, V)
        a = acceptance_probabilities(p[: len(draft)], None if q is None else q[: len(draft)],
                                     torch.tensor(draft))  # (k,)
        rejected_first = residual_distribution(p1, None if q is None else q1, torch.tensor(d1))  # (V,)
        joint += weight * (1 - a[0]) * rejected_first[:, None] * p2  # x1 ~ residual, x2 ~ p2[x1]
        if len(draft) == 1:
            second = p2[d1]  # bonus row
        else:
            second = step_given_draft(p2[d1], None if q is None else q2[d1], draft[1])
        joint[d1] += weight * a[0] * second
    return joint


@settings(max_examples=60)
@given(two_position_models(), st.sampled_from([1, 2]), st.booleans())
def test_first_two_tokens_follow_the_target_chain(model: tuple[torch.Tensor, ...], k: int,
                                                  sampled: bool) -> None:
    p1, p2, q1, q2 = model
    vocab_size = p1.shape[0]
    drafts: list[tuple[int, ...]] = []
    weights: list[float] = []
    for d1 in range(vocab_size):
        for d2 in range(vocab_size if k == 2 else 1):
            draft = (d1, d2)[:k]
            weight = 1.0
            if sampled:
                weight = float(q1[d1] * (q2[d1, d2] if k == 2 else 1.0))
                if weight == 0.0:
                    continue
            drafts.append(draft)
            weights.append(weight)
    if sampled:
        joint = first_two_tokens(p1, p2, q1, q2, drafts, weights)
        assert_distribution_equals(joint, p1[:, None] * p2, f"k={k}, sampled q1={q1}, q2={q2}")
    else:
        for draft in drafts:  # every deterministic chain, each on its own
            joint = first_two_tokens(p1, p2, None, None, [draft], [1.0])
            assert_distribution_equals(joint, p1[:, None] * p2, f"k={k}, deterministic draft {draft}")


# --- the residual guard ----------------------------------------------------------------------------

@given(st.data())
def test_residual_of_equal_distributions_falls_back_to_p(data: st.DataObject) -> None:
    p = data.draw(probability_vectors(data.draw(vocab_sizes())))
    token = torch.tensor(data.draw(st.integers(0, p.shape[0] - 1)))
    residual = residual_distribution(p, p.clone(), token)
    assert bool(torch.isfinite(residual).all())
    assert_distribution_equals(residual, p, "p == q")


@given(st.data())
def test_residual_is_a_distribution_when_q_is_p_up_to_rounding(data: st.DataObject) -> None:
    p = data.draw(probability_vectors(data.draw(vocab_sizes())))
    noise = torch.tensor(data.draw(st.lists(st.floats(-4.0, 4.0), min_size=p.shape[0], max_size=p.shape[0])),
                         dtype=torch.float64)
    q = p * (1 + noise * torch.finfo(torch.float64).eps)
    q = q / q.sum()
    residual = residual_distribution(p, q, torch.tensor(0))
    assert bool(torch.isfinite(residual).all()) and bool((residual >= 0).all())
    torch.testing.assert_close(residual.sum(), torch.tensor(1.0, dtype=torch.float64), **EXACT)


def test_residual_of_a_certain_deterministic_draft_is_finite() -> None:
    p = one_hot(2, 5)
    residual = residual_distribution(p, None, torch.tensor(2))
    assert bool(torch.isfinite(residual).all())
    assert_distribution_equals(residual, p, "p one-hot at the drafted token")


# --- verify_chain ------------------------------------------------------------------------------------

def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@settings(max_examples=60)
@given(st.data(), st.integers(0, 2**31))
def test_empty_draft_draws_from_the_first_row(data: st.DataObject, seed: int) -> None:
    vocab_size = data.draw(vocab_sizes())
    p = data.draw(probability_vectors(vocab_size))[None]  # (1, V)
    q = data.draw(st.sampled_from([None, torch.zeros(0, vocab_size, dtype=torch.float64)]))
    verdict = verify_chain(p, torch.zeros(0, dtype=torch.long), q, generator(seed))
    assert verdict.num_accepted == 0 and verdict.tokens.shape == (1,)
    assert p[0, int(verdict.tokens[0])] > 0


@pytest.mark.parametrize("with_q", [False, True])
def test_full_acceptance_emits_the_bonus_row_token(with_q: bool) -> None:
    vocab_size, drafts, bonus = 7, [3, 1, 4], 6
    p = torch.stack([one_hot(t, vocab_size) for t in [*drafts, bonus]])  # (k+1, V)
    q = p[:-1].clone() if with_q else None  # (k, V): p(d) = q(d) = 1
    for seed in range(20):
        verdict = verify_chain(p, torch.tensor(drafts), q, generator(seed))
        assert verdict.num_accepted == len(drafts)
        assert verdict.tokens.tolist() == [*drafts, bonus]


@settings(max_examples=100)
@given(chain_drafts(), st.integers(0, 2**31))
def test_verdict_is_an_accepted_prefix_plus_one_token(case: ChainCase, seed: int) -> None:
    verdict = verify_chain(case.p, case.tokens, case.q, generator(seed))
    n = verdict.num_accepted
    assert 0 <= n <= case.k
    assert verdict.tokens.shape == (n + 1,) and verdict.tokens.dtype == torch.long
    assert torch.equal(verdict.tokens[:n], case.tokens[:n])
    positions = torch.arange(n + 1)
    assert bool((case.p[positions, verdict.tokens] > 0).all()), "emitted a token the target rules out"
    if n < case.k:  # rejected at position n: only possible when p(d) < q(d)
        d = case.tokens[n]
        q_d = 1.0 if case.q is None else float(case.q[n, d])
        assert float(case.p[n, d]) < q_d
        if case.q is None:
            assert int(verdict.tokens[n]) != int(d), "a rejected deterministic draft was re-emitted"


@settings(max_examples=60)
@given(chain_drafts(min_k=1), st.integers(0, 2**31))
def test_draft_token_the_target_rules_out_is_never_accepted_nor_emitted(case: ChainCase, seed: int) -> None:
    p = case.p.clone()
    d = int(case.tokens[0])
    p[0, d] = 0.0
    if p[0].sum() == 0:
        p[0, (d + 1) % p.shape[1]] = 1.0
    p[0] /= p[0].sum()
    verdict = verify_chain(p, case.tokens, case.q, generator(seed))
    assert verdict.num_accepted == 0
    assert int(verdict.tokens[0]) != d


@settings(max_examples=100)
@given(st.data())
def test_greedy_accepts_the_longest_argmax_prefix_then_the_argmax(data: st.DataObject) -> None:
    vocab_size = data.draw(vocab_sizes())
    k = data.draw(st.integers(0, 5))
    target = torch.tensor(data.draw(st.lists(st.integers(0, vocab_size - 1), min_size=k + 1, max_size=k + 1)))
    matching = data.draw(st.integers(0, k))
    rest = data.draw(st.lists(st.integers(0, vocab_size - 1), min_size=k - matching, max_size=k - matching))
    draft = torch.tensor(target[:matching].tolist() + rest, dtype=torch.long)  # (k,)
    expected = 0
    while expected < k and int(draft[expected]) == int(target[expected]):
        expected += 1
    verdict = verify_greedy(target, draft)
    assert verdict.num_accepted == expected
    assert verdict.tokens.tolist() == draft[:expected].tolist() + [int(target[expected])]


# --- verify_chain, statistically ----------------------------------------------------------------------

def random_distribution(vocab_size: int, gen: torch.Generator, zero: int | None = None) -> torch.Tensor:
    weights = torch.rand(vocab_size, generator=gen, dtype=torch.float64) + 0.2
    if zero is not None:
        weights[zero] = 0.0
    return weights / weights.sum()


def assert_frequencies_match(tokens: list[int], p: torch.Tensor, context: str) -> None:
    counts = torch.bincount(torch.tensor(tokens), minlength=p.shape[0]).double()
    support = p > 0
    assert counts[~support].sum() == 0, f"{context}: emitted tokens with p = 0: {counts}"
    expected = p[support] * len(tokens)
    result = chisquare(counts[support].numpy(), expected.numpy())
    assert result.pvalue > FALSE_ALARM, (f"{context}: counts {counts.tolist()} vs expected "
                                         f"{expected.tolist()}, p-value {result.pvalue:.3g}")


def test_sampled_chain_first_token_frequencies_match_p() -> None:
    vocab_size, k, draws = 6, 2, 12000
    gen = generator(1234)
    p = torch.stack([random_distribution(vocab_size, gen, zero=z) for z in (4, None, 0)])  # (k+1, V)
    q = torch.stack([random_distribution(vocab_size, gen, zero=z) for z in (1, 2)])  # (k, V)
    drafts = torch.stack([torch.multinomial(q[i], draws, replacement=True, generator=gen)
                          for i in range(k)], dim=1)  # (draws, k), row j: d_i ~ q[i]
    first = [int(verify_chain(p, drafts[j], q, gen).tokens[0]) for j in range(draws)]
    assert_frequencies_match(first, p[0], f"sampled chain, q={q[0]}")


def test_deterministic_chain_first_token_frequencies_match_p() -> None:
    vocab_size, draws = 6, 6000
    gen = generator(4321)
    p = torch.stack([random_distribution(vocab_size, gen, zero=5) for _ in range(2)])  # (2, V)
    # any id, p(d) = 0 included; skewed, since uniform drafts would hide a residual that keeps d
    skew = torch.tensor([0.05, 0.1, 0.5, 0.05, 0.1, 0.2], dtype=torch.float64)
    drafts = torch.multinomial(skew, draws, replacement=True, generator=gen)[:, None]  # (draws, 1)
    first = [int(verify_chain(p, drafts[j], None, gen).tokens[0]) for j in range(draws)]
    assert_frequencies_match(first, p[0], "deterministic chain")
