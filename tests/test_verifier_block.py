"""Block verification (`specdec.verifier.block`) is lossless, keeps at least what token-wise
verification keeps, and keeps the paper's 11/9 on its toy case; planted bugs are caught.

The law of the real function is enumerated exactly (`test_verifier_tree.exact_law`: scripted
uniforms and multinomials, every branch weighted), over every draft the drafter can make
(`marginal_verifier_law`), for context-dependent p and q with exact zeros, ties, one-hot rows and
rows where q = p; the output extended by plain sampling must be the target's to 1e-9.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from specdec.trees import chain_parents
from specdec.types import Verdict
from specdec.verifier import verify_chain
from specdec.verifier.block import block_weights, verify_block

from test_verifier_tree import TRUNCATED, PrefixModel, assert_lossless, marginal_verifier_law

CHAIN_MODES = ("shared", "mixed", "top")  # sampled rows, sampled beside one-hot rows, deterministic


def as_tree(verify: Callable[..., Verdict]) -> Callable[..., Verdict]:
    """A chain rule in the tree verifier's signature (the harness's)."""
    return lambda p, tokens, parents, q, generator: verify(p, tokens, q, generator)


def expected_accepted(law: dict) -> float:
    return sum(w * len(path) for (path, _), w in law.items())


class Constant:
    """p and q the same after every prefix: the paper's toy case."""

    def __init__(self, p: tuple[float, ...], q: tuple[float, ...]) -> None:
        self.p_row, self.q_row, self.vocab = p, q, len(p)

    def p(self, prefix: tuple[int, ...]) -> tuple[float, ...]:
        return self.p_row

    def q(self, prefix: tuple[int, ...], slot: int) -> tuple[float, ...]:
        return self.q_row


def test_weights_are_the_running_clamped_product() -> None:
    p_d = torch.tensor([0.5, 0.9, 0.1, 0.0, 0.7], dtype=torch.float64)
    q_d = torch.tensor([0.25, 0.3, 0.2, 0.5, 0.1], dtype=torch.float64)
    expected, w = [1.0], 1.0
    for a, b in zip(p_d.tolist(), q_d.tolist()):
        w = min(1.0, w * a / b)
        expected.append(w)
    torch.testing.assert_close(block_weights(p_d, q_d), torch.tensor(expected, dtype=torch.float64), rtol=0,
                               atol=1e-15)


@pytest.mark.parametrize("mode", CHAIN_MODES)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_block_verification_is_lossless(k: int, mode: str) -> None:
    for seed in range(4 if k < 4 else 2):
        model = PrefixModel(seed, 3, TRUNCATED if seed % 2 else None)
        law = marginal_verifier_law(as_tree(verify_block), model, chain_parents(k), mode)
        assert_lossless(model, law, k + 1, f"k {k}, {mode}, seed {seed}")


@pytest.mark.parametrize("mode", CHAIN_MODES)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_block_keeps_at_least_what_token_wise_keeps(k: int, mode: str) -> None:
    for seed in range(6):
        model = PrefixModel(seed, 3, TRUNCATED if seed % 2 else None)
        block = expected_accepted(marginal_verifier_law(as_tree(verify_block), model, chain_parents(k), mode))
        token = expected_accepted(marginal_verifier_law(as_tree(verify_chain), model, chain_parents(k), mode))
        assert block >= token - 1e-12, f"k {k}, {mode}, seed {seed}: block {block}, token-wise {token}"
        if k == 1 or mode == "top":  # one test, or one-hot q: nothing to gain
            assert abs(block - token) <= 1e-12, f"k {k}, {mode}, seed {seed}: block {block}, token-wise {token}"


def test_the_papers_toy_case() -> None:
    """p = (1/3, 2/3), q = (2/3, 1/3) after every prefix, k = 2: 10/9 tokens kept token-wise, 11/9 by block."""
    model = Constant((1 / 3, 2 / 3), (2 / 3, 1 / 3))
    token = expected_accepted(marginal_verifier_law(as_tree(verify_chain), model, chain_parents(2), "shared"))
    block = expected_accepted(marginal_verifier_law(as_tree(verify_block), model, chain_parents(2), "shared"))
    assert abs(token - 10 / 9) <= 1e-12 and abs(block - 11 / 9) <= 1e-12, (token, block)


def stop_at_first_failure(h: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Lossy: block's tests read like token-wise ones, keeping only the prefixes before the first failure."""
    passed = uniforms < h[1:]
    return passed.long().cumprod(0).sum()


def test_the_enumeration_catches_a_block_that_stops_at_its_first_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    from specdec.verifier import block as module

    monkeypatch.setattr(module, "kept_prefix", stop_at_first_failure)
    model = Constant((1 / 3, 2 / 3), (2 / 3, 1 / 3))
    law = marginal_verifier_law(as_tree(verify_block), model, chain_parents(2), "shared")
    with pytest.raises(AssertionError, match="off by"):
        assert_lossless(model, law, 3, "stop at the first failure")  # type: ignore[arg-type]


def kept_below_squared_tests(h: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Lossy: each prefix i passes when its uniform falls below h_i squared, while the verdict
    reports h_i. Weighted by what a verifier reports, the enumeration cannot tell it from the real
    rule; weighted by the thresholds its uniforms are compared with, it must."""
    passed = torch.cat([torch.ones(1, dtype=torch.bool), uniforms < h[1:] ** 2])
    return (passed.long() * torch.arange(uniforms.shape[0] + 1)).max()


def test_the_enumeration_catches_a_test_against_another_threshold_than_the_one_reported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from specdec.verifier import block as module

    monkeypatch.setattr(module, "kept_prefix", kept_below_squared_tests)
    model = Constant((1 / 3, 2 / 3), (2 / 3, 1 / 3))
    law = marginal_verifier_law(as_tree(verify_block), model, chain_parents(2), "shared")
    with pytest.raises(AssertionError, match="off by"):
        assert_lossless(model, law, 3, "u < h**2")  # type: ignore[arg-type]


class TwoRows:
    """A context-dependent case where keeping one token of two leaves a residual of two ids:
    after d_1 = 0 (w_1 = 0.8), max(0, w_1 p_2 - q_2) = (0, 0.38, 0.14)."""

    vocab = 3

    def p(self, prefix: tuple[int, ...]) -> tuple[float, ...]:
        return (0.1, 0.6, 0.3) if prefix[-1:] == (0,) else (0.4, 0.3, 0.3)

    def q(self, prefix: tuple[int, ...], slot: int) -> tuple[float, ...]:
        return (0.8, 0.1, 0.1) if prefix[-1:] == (0,) else (0.5, 0.25, 0.25)


def test_the_enumeration_catches_a_residual_without_its_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    """The correction after keeping i < k tokens from norm(max(0, p - q)), the weight w_i left out."""
    from specdec.verifier import block as module

    model = TwoRows()
    assert_lossless(model, marginal_verifier_law(as_tree(verify_block), model, chain_parents(2), "shared"), 3,
                    "block")  # type: ignore[arg-type]
    original = module.block_tests

    def unweighted(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, _ = original(p, q, tokens)
        return h, (p[: tokens.shape[0]] - q).clamp(min=0.0)

    monkeypatch.setattr(module, "block_tests", unweighted)
    law = marginal_verifier_law(as_tree(verify_block), model, chain_parents(2), "shared")
    with pytest.raises(AssertionError, match="off by"):
        assert_lossless(model, law, 3, "unweighted residual")  # type: ignore[arg-type]
