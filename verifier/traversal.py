"""Traversal verification of a token tree (Weng et al., NeurIPS 2025, "Traversal Verification
for Speculative Tree Decoding"): the tree is settled from the leaves up, each node judged by the
whole path from the root to it rather than token by token.

Each node carries a weight w, the share of the target's mass its path still holds against the
draft's (block verification's weight, Sun et al. 2025), and a target row p' (p at the node, later
its residual). The root starts with w = 1 and p' = p. A child x with q row q_x gets

    w_x = min(1, w p'(x) / q_x(x)),

and its subtree is settled first, depth first, children in draft order. If nothing below the
node is kept, the node's turn comes: it is kept with probability w, and the next token is drawn
from its p'. Each time a child's subtree is settled without keeping anything, the node's state is
conditioned on that failure, which had probability f = m + 1 - w:

    r = max(0, w p' - q_x),  m = sum r,  w <- m / f,  p' <- r / m.

Why it is exact: by induction a node in state (w, p') keeps something in its subtree with
probability w, and what it emits, the kept path and the next token, follows w p' continued by
the target. A child x takes min(q_x(x), w p'(x)) of that mass; the rest, r, and the failures'
probability f are what the remaining children and the node itself must account for, which the
update gives them. The root keeps w = 1, so it always ends the walk. On a chain this is block
verification tried from the longest prefix down (the same law as `verify_block`); on a tree of
depth 1 it is SpecInfer's sibling residual rule, draw for draw (`verify_tree`). Each child is
tested against the q it was drawn from given its elder siblings (`sibling_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specdec.trees import children
from specdec.types import Verdict
from specdec.verifier.chain import normalized_residual

__all__ = ["verify_traversal"]


def verify_traversal(
    p: torch.Tensor | Callable[[int], torch.Tensor],
    tokens: torch.Tensor,
    parents: Sequence[int],
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> Verdict:
    """Traversal verification over a tree draft, in `verify_tree`'s form.

    p: [n + 1, V] processed target distributions (row 0 at the root, row i + 1 at node i), or a
    function giving row r [V], so that only the rows the walk visits are computed;
    tokens: [n]; parents: n parent indices (-1 = child of the root); q: [n, V] (each node's q
    given its ancestors and elder siblings) or None (one-hot: deterministic candidates).
    Draws one uniform per node tested, children before their parent (none for the root), then
    one token. `acceptance` and `uniforms` hold each test's weight and draw, in the order drawn,
    and `tested` the node of each; a node tested with weight 0 skips its descendants (none of
    them could be kept).
    """
    row_of = p.__getitem__ if isinstance(p, torch.Tensor) else p
    root = row_of(0)
    dtype, device = root.dtype, root.device
    if q is not None:  # rows validated to sum to 1 within rounding; sampling used them normalised
        q = q.to(dtype)
        q = q / q.sum(dim=-1, keepdim=True)
    kids = children(parents)
    drafted = tokens.tolist()
    weights: list[float] = []
    draws: list[float] = []
    tested: list[int] = []

    def test(node: int, weight: float) -> bool:
        uniform = float(torch.rand((), generator=generator, dtype=dtype, device=device))
        weights.append(weight)
        draws.append(uniform)
        tested.append(node)
        return uniform < weight

    def settle(row: int, weight: float, target: torch.Tensor) -> tuple[list[int], torch.Tensor] | None:
        """Settle the subtree at `row` (0: the root) in state (weight, target [V]): the kept path
        below it and the next token, or None when nothing in it is kept."""
        for child in kids[row]:
            token = drafted[child]
            q_row = (torch.zeros_like(target).index_fill_(0, tokens[child].reshape(1), 1.0) if q is None
                     else q[child])  # (V,)
            child_weight = min(1.0, weight * float(target[token]) / float(q_row[token]))
            if child_weight > 0 and kids[child + 1]:
                kept = settle(child + 1, child_weight, row_of(child + 1))
            else:
                kept = ([], torch.multinomial(row_of(child + 1), 1, generator=generator)) \
                    if test(child, child_weight) else None
            if kept is not None:
                return [child, *kept[0]], kept[1]
            residual = (weight * target - q_row).clamp(min=0.0)  # (V,)
            mass = float(residual.sum())
            failed = mass + (1.0 - weight)  # the probability that this child's subtree kept nothing
            if failed > 0:
                weight = min(1.0, mass / failed)
            target = normalized_residual(residual, target)
        if row == 0 or test(row - 1, weight):  # the root (weight 1) always ends the walk
            return [], torch.multinomial(target, 1, generator=generator)
        return None

    kept = settle(0, 1.0, root)
    assert kept is not None  # the root keeps itself
    path, last = kept
    accepted = tokens[path] if path else tokens[:0]
    return Verdict(tokens=torch.cat([accepted, last]), num_accepted=len(path),
                   acceptance=torch.tensor(weights, dtype=dtype), uniforms=torch.tensor(draws, dtype=dtype),
                   path=tuple(path), tested=tuple(tested))
