"""The exact harness run against each planted bug of each rule: the largest error, over a few
models, of the law of the emitted tokens (extended by plain sampling) against the target's. The
real rules come out at rounding (about 1e-16), every planted bug far above the tests' 1e-12.

    cd tests && ../.venv/bin/python planted_bugs.py

The same bugs are the power tests of `test_verifier_block` and `test_verification_rules`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import torch

from specdec.trees import chain_parents
from specdec.verifier import block as block_module
from specdec.verifier import traversal as traversal_module
from specdec.verifier import verify_block, verify_traversal, verify_tree
from test_verification_rules import TREES, WOR_TREES, FullSupport, depth, without_replacement_law
from test_verifier_block import Constant, TwoRows, as_tree, kept_below_squared_tests, stop_at_first_failure
from test_verifier_tree import PrefixModel, lossless_error, marginal_verifier_law

Case = tuple[Any, Sequence[int], str]  # (model, parents, draft mode)


def worst(verify: Callable[..., Any], cases: list[Case]) -> float:
    return max(lossless_error(model, marginal_verifier_law(verify, model, parents, mode), depth(parents) + 1)
               for model, parents, mode in cases)


def unweighted_tests(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block's tests with the correction from norm(max(0, p - q)): the prefix weight w_i left out."""
    h, _ = ORIGINAL_TESTS(p, q, tokens)
    return h, (p[: tokens.shape[0]] - q).clamp(min=0.0)


ORIGINAL_TESTS = block_module.block_tests


def main() -> None:
    chains: list[Case] = [(Constant((1 / 3, 2 / 3), (2 / 3, 1 / 3)), chain_parents(2), "shared"),
                          (TwoRows(), chain_parents(2), "shared"),
                          *((PrefixModel(seed, 3), chain_parents(3), "shared") for seed in range(5))]
    block = as_tree(verify_block)
    print(f"block, as shipped:                               {worst(block, chains):.3g}")
    with mock.patch.object(block_module, "kept_prefix", stop_at_first_failure):
        print(f"block, stopping at the first failed test:        {worst(block, chains):.3g}")
    with mock.patch.object(block_module, "block_tests", unweighted_tests):
        print(f"block, correction without the prefix weight:     {worst(block, chains):.3g}")
    with mock.patch.object(block_module, "kept_prefix", kept_below_squared_tests):
        print(f"block, testing u < h**2 while reporting h:       {worst(block, chains):.3g}")
    trees: list[Case] = [(PrefixModel(800 + i, 3), parents, "shared") for i, parents in enumerate(TREES[:5])]
    print(f"traversal, as shipped:                           {worst(verify_traversal, trees):.3g}")
    with mock.patch.object(traversal_module, "normalized_residual", lambda residual, fallback: fallback):
        print(f"traversal, a stale p row after a failed child:   {worst(verify_traversal, trees):.3g}")
    drawn = [(FullSupport(200 + i, 3 if len(parents) > 3 else 4), parents) for i, parents in enumerate(WOR_TREES)]
    for name, rule in (("sibling rule", verify_tree), ("traversal", verify_traversal)):
        for declared in ("without_replacement", "iid"):
            error = max(lossless_error(model, without_replacement_law(rule, model, parents, declared),
                                       depth(parents) + 1) for model, parents in drawn)
            print(f"{name}, siblings drawn without replacement, declared {declared}: {error:.3g}")


if __name__ == "__main__":
    main()
