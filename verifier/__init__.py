"""The shared verifier: pure functions that turn a draft and the target's distributions into
emitted tokens, keeping the output distribution exactly that of plain sampling; it may import
`specdec.types` and `specdec.trees`, and never a model.

Conventions (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
Sampling"):

- ``p``: the target's processed next-token distributions, ``[k + 1, V]`` for a chain of ``k``
  draft tokens (row ``i`` is the distribution at draft position ``i``; row ``k`` gives the bonus).
- ``q``: the draft's distributions, ``[k, V]``; ``None`` for deterministic drafts (one-hot).
- A draft token ``d`` is accepted with probability ``min(1, p(d) / q(d))``; at the first
  rejection a correction is drawn from ``norm(max(0, p - q))``; after a full acceptance a bonus
  token is drawn from ``p[k]``.

Trees (``specdec.verifier.tree``) generalise the chain: each node is checked against ``p`` at
its parent's row, siblings in turn against the residual left by the ones before them.

Block verification (``specdec.verifier.block``; Sun et al. 2025) judges a chain as a whole and
keeps the longest prefix whose own test passes: never fewer tokens on average than the
token-wise rule, with the same output law. Traversal verification (``specdec.verifier.traversal``;
Weng et al. 2025) does the same for a tree, settling it from the leaves up. A run picks its rule
by name (``specdec.verifier.rules``); how a tree's siblings were drawn decides the q each is
tested against (``specdec.verifier.siblings``).

Nothing here calls a model.
"""

from __future__ import annotations

from specdec.verifier.block import block_verdict, verify_block
from specdec.verifier.chain import (
    acceptance_probabilities,
    chain_verdict,
    greedy_verdict,
    greedy_verdicts,
    residual_distribution,
    verify_chain,
    verify_greedy,
)
from specdec.verifier.expected import expected_accepted
from specdec.verifier.rules import DEFAULT_RULE, VERIFY_RULES, chain_rule, check_verify_rule, tree_rule
from specdec.verifier.siblings import SIBLING_DRAWS, sibling_fault, sibling_rows
from specdec.verifier.traversal import verify_traversal
from specdec.verifier.tree import verify_tree, verify_tree_greedy
from specdec.verifier.validate import DraftError, draft_faults, validate_draft

__all__ = [
    "DEFAULT_RULE",
    "DraftError",
    "SIBLING_DRAWS",
    "VERIFY_RULES",
    "acceptance_probabilities",
    "block_verdict",
    "chain_rule",
    "chain_verdict",
    "check_verify_rule",
    "draft_faults",
    "expected_accepted",
    "greedy_verdict",
    "greedy_verdicts",
    "residual_distribution",
    "sibling_fault",
    "sibling_rows",
    "tree_rule",
    "validate_draft",
    "verify_block",
    "verify_chain",
    "verify_greedy",
    "verify_traversal",
    "verify_tree",
    "verify_tree_greedy",
]
