"""`specdec.teaching.rule_compare`: token-wise and block verification of one draft with the same
draws, on the toy case of Sun et al. (ICLR 2025), p = (1/3, 2/3) and q = (2/3, 1/3) at every
position, k = 2, every number worked by hand (tokens a = 0, b = 1; p/q is 1/2 for a, 2 for b)."""

from __future__ import annotations

import re

import pytest
import torch

from specdec.teaching.rule_compare import RuleComparison, compare_rules

P = torch.tensor([[1 / 3, 2 / 3]] * 3, dtype=torch.float64)  # (k + 1, V)
Q = torch.tensor([[2 / 3, 1 / 3]] * 2, dtype=torch.float64)  # (k, V)


def _compare(draft: tuple[int, int], uniforms: tuple[float, float], q: torch.Tensor | None = Q) -> RuleComparison:
    return compare_rules(P, torch.tensor(draft), q, torch.tensor(uniforms, dtype=torch.float64))


# draft: (a_1, a_2) = min(1, p/q) per token; (h_1, h_2) from the weights w_1, w_2:
#   aa: w = (1/2, 1/4); m_1 = max(0, 1/6 - 2/3) + max(0, 1/3 - 1/3) = 0, so h_1 = 0; h_2 = w_2 = 1/4
#   ab: w = (1/2, 1);   m_1 = 0, h_1 = 0; h_2 = w_2 = 1 (the pair is as likely under p as under q)
#   ba: w = (1, 1/2);   m_1 = max(0, 1/3 - 2/3) + max(0, 2/3 - 1/3) = 1/3, h_1 = (1/3) / (1/3 + 0) = 1; h_2 = 1/2
#   bb: w = (1, 1);     h_1 = 1 (as for ba: w_1 = 1); h_2 = 1
@pytest.mark.parametrize("draft, acceptance, block_h", [
    ((0, 0), (0.5, 0.5), (0.0, 0.25)),
    ((0, 1), (0.5, 1.0), (0.0, 1.0)),
    ((1, 0), (1.0, 0.5), (1.0, 0.5)),
    ((1, 1), (1.0, 1.0), (1.0, 1.0)),
])
def test_the_papers_toy_case_has_the_hand_worked_tests(draft, acceptance, block_h) -> None:
    got = _compare(draft, (0.0, 0.0))
    assert got.acceptance == pytest.approx(acceptance, abs=1e-12)
    assert got.block_h == pytest.approx(block_h, abs=1e-12)


def test_block_keeps_the_pair_ab_where_token_wise_stops_at_a() -> None:
    """u_1 = 0.7 fails a's token-wise test (0.7 >= 1/2): token-wise keeps nothing. Block's test of
    the whole pair, u_2 = 0.9 < h_2 = 1, passes: the later prefix is kept after the earlier failed."""
    got = _compare((0, 1), (0.7, 0.9))
    assert (got.token_kept, got.block_kept) == (0, 2)
    assert got.uniforms == (0.7, 0.9)


def test_on_one_draw_block_can_keep_fewer() -> None:
    """aa with u = (0.3, 0.9): token-wise keeps a (0.3 < 1/2), then fails (0.9 >= 1/2). Block's
    h_1 = 0 and 0.9 >= h_2 = 1/4: it keeps nothing. Only on average does block keep more."""
    got = _compare((0, 0), (0.3, 0.9))
    assert (got.token_kept, got.block_kept) == (1, 0)


@pytest.mark.parametrize("draft, uniforms, token_kept, block_kept", [
    ((0, 0), (0.2, 0.2), 2, 2),  # both pass both tests (0.2 < 1/4 for block's h_2)
    ((0, 0), (0.2, 0.3), 2, 0),  # token-wise: 0.2, 0.3 < 1/2; block: 0.3 >= h_2 = 1/4 and h_1 = 0
    ((1, 0), (0.99, 0.6), 1, 1),  # a_1 = 1 passes, a_2 = 1/2 fails; block: h_2 = 1/2 fails, h_1 = 1 passes
    ((1, 1), (0.99, 0.99), 2, 2),
])
def test_the_number_each_rule_keeps(draft, uniforms, token_kept, block_kept) -> None:
    got = _compare(draft, uniforms)
    assert (got.token_kept, got.block_kept) == (token_kept, block_kept)


def test_a_deterministic_draft_reads_q_as_one_hot() -> None:
    """q = None: a_i = p_i(d_i) = 2/3 for b, w = (2/3, 4/9), h_2 = 4/9; m_1 = max(0, 2/3 · 1/3 - 0) +
    max(0, 2/3 · 2/3 - 1) = 2/9, so h_1 = (2/9) / (2/9 + 1/3) = 2/5. With u = (0.3, 0.5) token-wise
    keeps both (< 2/3); block fails the pair (0.5 >= 4/9) and keeps one (0.3 < 2/5)."""
    got = _compare((1, 1), (0.3, 0.5), q=None)
    assert got.acceptance == pytest.approx((2 / 3, 2 / 3), abs=1e-12)
    assert got.block_h == pytest.approx((2 / 5, 4 / 9), abs=1e-12)
    assert (got.token_kept, got.block_kept) == (2, 1)


def test_unnormalised_q_rows_are_read_normalised_as_the_verifier_does() -> None:
    assert _compare((0, 1), (0.7, 0.9), q=3 * Q) == _compare((0, 1), (0.7, 0.9))


@pytest.mark.parametrize("p, q, uniforms, words", [
    (P[:2], Q, (0.1, 0.1), "p [k + 1, V] and uniforms [k]"),
    (P, Q, (0.1,), "p [k + 1, V] and uniforms [k]"),
    (P, Q[:1], (0.1, 0.1), "q [k, V] = [2, 2] or None; got (1, 2)"),
])
def test_wrong_shapes_are_named(p, q, uniforms, words) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        compare_rules(p, torch.tensor([0, 1]), q, torch.tensor(uniforms, dtype=torch.float64))
