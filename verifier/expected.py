"""The expected number of draft tokens each rule keeps from one draft, exactly: the average over
the verifier's own draws, with the draft and the target's rows held fixed.

This is how rules are compared on the same drafts without sampling noise (matched draws are the
other way, and only match until the verdicts differ): run a generation, and at every step ask
what each rule would keep on average from that step's draft. The recursions follow each rule's
own decisions (`verify_chain`, `verify_block`, `verify_tree`, `verify_traversal`); the tests tie
them to the rules' enumerated laws.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.trees import children
from specdec.verifier.block import block_tests
from specdec.verifier.chain import acceptance_probabilities, normalized_residual, residual_distribution

__all__ = ["expected_accepted"]


def expected_accepted(rule: str, p: torch.Tensor, tokens: torch.Tensor, parents: Sequence[int] | None,
                      q: torch.Tensor | None) -> float:
    """E[tokens kept] by `rule` ("token", "block", "traversal"; as `specdec.verifier.rules` maps
    them: a chain is token-wise or block, a tree the sibling rule or traversal) on one draft.

    p: [n + 1, V] the target's processed rows (row 0 at the root, row i + 1 at node i); tokens: [n];
    parents: None for a chain; q: [n, V] each node's q given its ancestors and elder siblings
    (`sibling_rows`), or None (one-hot).
    """
    p = p.double()
    q = None if q is None else (q.double() / q.double().sum(-1, keepdim=True))
    n = tokens.shape[0]
    if n == 0:
        return 0.0
    if parents is None:
        if rule == "token":
            accept = acceptance_probabilities(p[:n], q, tokens)  # (k,)
            return float(accept.cumprod(0).sum())
        one_hot = q if q is not None else torch.zeros_like(p[:n]).scatter_(-1, tokens.unsqueeze(-1), 1.0)
        h, _ = block_tests(p, one_hot, tokens)  # (k + 1,): prefix i kept when its test passes and no longer one's
        no_longer = torch.cat([(1 - h[2:]).flip(0).cumprod(0).flip(0), h.new_ones(1)])  # (k,): prod_{j>i} (1 - h_j)
        return float((torch.arange(1, n + 1, dtype=p.dtype) * h[1:] * no_longer).sum())
    kids = children(parents)
    drafted = tokens.tolist()

    def q_row(child: int, like: torch.Tensor) -> torch.Tensor:
        if q is not None:
            return q[child]
        return torch.zeros_like(like).index_fill_(0, tokens[child].reshape(1), 1.0)

    def sibling(row: int, target: torch.Tensor) -> float:
        """E[nodes kept below `row`] under the sibling residual rule, starting from `target` there."""
        reach, total = 1.0, 0.0
        for child in kids[row]:
            row_q = q_row(child, target)
            accept = min(1.0, float(target[drafted[child]]) / float(row_q[drafted[child]]))
            if accept > 0:
                total += reach * accept * (1.0 + sibling(child + 1, p[child + 1]))
            reach *= 1.0 - accept
            if reach <= 0:
                break
            target = residual_distribution(target, None if q is None else q[child], tokens[child])
        return total

    def traversal(row: int, weight: float, target: torch.Tensor) -> tuple[float, float]:
        """(P(the subtree at `row` keeps something), E[nodes kept below `row`; it does]) under
        traversal verification in state (weight, target). For a fixed draft the first is not the
        weight: w is what the subtree keeps on average over the drafts it could have been."""
        reach, kept, below = 1.0, 0.0, 0.0
        for child in kids[row]:
            row_q = q_row(child, target)
            child_weight = min(1.0, weight * float(target[drafted[child]]) / float(row_q[drafted[child]]))
            if child_weight > 0 and kids[child + 1]:
                child_kept, child_below = traversal(child + 1, child_weight, p[child + 1])
            else:
                child_kept, child_below = child_weight, 0.0  # a leaf's own test, or a subtree that cannot pass
            kept += reach * child_kept
            below += reach * (child_kept + child_below)
            reach *= 1.0 - child_kept
            residual = (weight * target - row_q).clamp(min=0.0)
            mass = float(residual.sum())
            failed = mass + (1.0 - weight)
            if failed > 0:
                weight = min(1.0, mass / failed)
            target = normalized_residual(residual, target)
        return kept + reach * (1.0 if row == 0 else weight), below

    if rule == "traversal":
        return traversal(0, 1.0, p[0])[1]
    return sibling(0, p[0])

