"""The verification rules a run can choose (`generate(..., verify_rule=...)`), by name.

- ``"token"``: token-wise speculative sampling for chains (Leviathan et al. 2023; Chen et al.
  2023) and SpecInfer's sibling residual rule for trees (Miao et al. 2024).
- ``"block"``: block verification for chains (Sun et al., ICLR 2025), the best rule for a
  single chain; trees keep the sibling residual rule.
- ``"traversal"``: traversal verification for trees (Weng et al., NeurIPS 2025), which on a
  chain is block verification, so chains take `block_verdict` (the same law, on the device).

Every rule is lossless for every drafter; they differ in how many draft tokens they keep from
the same draft and target forward, and only when the draft carries a real q at a temperature
above 0: with one-hot q (deterministic candidates) they all keep what sample-and-match keeps,
and at temperature 0 every rule accepts the argmax path.
"""

from __future__ import annotations

from collections.abc import Callable

from specdec.verifier.block import block_verdict
from specdec.verifier.chain import chain_verdict
from specdec.verifier.traversal import verify_traversal
from specdec.verifier.tree import verify_tree

__all__ = ["DEFAULT_RULE", "VERIFY_RULES", "chain_rule", "check_verify_rule", "tree_rule"]

VERIFY_RULES = ("token", "block", "traversal")
# The default: the rule that keeps the most of a sampled draft, chain or tree, for no loss and a
# verdict's worth of host work (docs/verification.md, "Which rule by default").
DEFAULT_RULE = "traversal"


def check_verify_rule(rule: object) -> str:
    """`rule` when it names a rule; a ValueError naming it and the choices otherwise."""
    if not isinstance(rule, str) or rule not in VERIFY_RULES:
        raise ValueError(f"verify_rule must be one of {', '.join(map(repr, VERIFY_RULES))}, got {rule!r}")
    return rule


def chain_rule(rule: str) -> Callable[..., tuple]:
    """The device-side chain verdict of `rule` (`chain_verdict`'s signature and result)."""
    return chain_verdict if check_verify_rule(rule) == "token" else block_verdict


def tree_rule(rule: str) -> Callable[..., object]:
    """The tree verifier of `rule` (`verify_tree`'s signature: p rows, tokens, parents, q, generator)."""
    return verify_traversal if check_verify_rule(rule) == "traversal" else verify_tree
