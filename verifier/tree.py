"""Verification of a token tree: sampled (sibling residual chain), deterministic and greedy.

The walk starts at the root (the last committed token) and, at each accepted node, tries its
children in draft order against the target's distribution there, `p'`, starting from `p`:

- child x with draft distribution q (a row of `probs`) is accepted with probability
  min(1, p'(x) / q(x)); on rejection p' becomes norm(max(0, p' - q)) and the next child is
  tried. This is SpecInfer's multi-step speculative sampling (Miao et al. 2024, "SpecInfer",
  §4.3, Theorem 4.2): lossless when each sibling was drawn independently from its own q, so
  duplicate siblings are allowed and must not be merged.
- a deterministic child x (no probs: a one-hot q) is accepted with probability p'(x); on
  rejection x is zeroed in p' and p' renormalised ("sample and match": the one-hot case of the
  same rule, exact for any fixed set of distinct candidates such as a top-k).
- when every child is rejected, the correction is drawn from the last p'; when the accepted
  node has no children, the bonus is drawn from that node's own row of p (the next position's
  distribution), never from a residual of the level above.

Greedy trees follow the child equal to the target's argmax at each accepted node, so the
output equals plain greedy decoding whatever the tree holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specdec.trees import children
from specdec.types import Verdict
from specdec.verifier.chain import residual_distribution

__all__ = ["verify_tree", "verify_tree_greedy"]


def verify_tree(
    p: torch.Tensor | Callable[[int], torch.Tensor],
    tokens: torch.Tensor,
    parents: Sequence[int],
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> Verdict:
    """Speculative sampling over a tree draft.

    p: [n + 1, V] processed target distributions (row 0 at the root, row i + 1 at node i), or a
    function giving row r [V], so that only the rows the walk visits are computed;
    tokens: [n]; parents: n parent indices (-1 = child of the root); q: [n, V] or None.
    Draws one uniform per child tried, then one token (correction or bonus) from `generator`.
    Returns the accepted path's tokens then the last token; `acceptance` and `uniforms` hold
    min(1, p'/q) and the draw of each node tried, in the order tried.
    """
    row_of = p.__getitem__ if isinstance(p, torch.Tensor) else p
    root = row_of(0)
    dtype, device = root.dtype, root.device
    if q is not None:  # rows validated to sum to 1 within rounding; sampling used them normalised
        q = q.to(dtype)
        q = q / q.sum(dim=-1, keepdim=True)
    kids = children(parents)
    drafted = tokens.tolist()
    path: list[int] = []
    tried: list[float] = []
    draws: list[float] = []
    row = 0
    while True:
        distribution = root if row == 0 else row_of(row)  # (V,) p' at this node, before any sibling is tried
        chosen = -1
        for child in kids[row]:
            token = drafted[child]
            p_x = float(distribution[token])
            accept = p_x if q is None else min(1.0, p_x / float(q[child, token]))
            uniform = float(torch.rand((), generator=generator, dtype=dtype, device=device))
            tried.append(accept)
            draws.append(uniform)
            if uniform < accept:
                chosen = child
                break
            distribution = residual_distribution(distribution, None if q is None else q[child], tokens[child])
        if chosen < 0:
            last = torch.multinomial(distribution, 1, generator=generator)  # (1,)
            break
        path.append(chosen)
        row = chosen + 1
    accepted = tokens[path] if path else tokens[:0]
    return Verdict(tokens=torch.cat([accepted, last]), num_accepted=len(path),
                   acceptance=torch.tensor(tried, dtype=dtype), uniforms=torch.tensor(draws, dtype=dtype),
                   path=tuple(path))


def verify_tree_greedy(target_tokens: torch.Tensor | Callable[[int], int], tokens: torch.Tensor,
                       parents: Sequence[int]) -> Verdict:
    """Greedy verification of a tree: from the root, follow the child equal to the target's argmax.

    target_tokens: [n + 1] argmax of each row (row 0 the root, row i + 1 node i), or a function
    giving row r's argmax, so that only the rows the walk visits are computed; tokens: [n].
    The last token is the argmax at the deepest accepted node. `acceptance` holds 1.0 for the
    matching child and 0.0 for each child compared before it or instead of it.
    """
    kids = children(parents)
    drafted = tokens.tolist()
    argmax_of = (lambda row: int(target_tokens[row])) if isinstance(target_tokens, torch.Tensor) else target_tokens
    path: list[int] = []
    compared: list[float] = []
    row = 0
    while True:
        chosen = -1
        best = argmax_of(row)
        for child in kids[row]:
            match = drafted[child] == best
            compared.append(1.0 if match else 0.0)
            if match:
                chosen = child
                break
        if chosen < 0:
            break
        path.append(chosen)
        row = chosen + 1
    accepted = tokens[path] if path else tokens[:0]
    last = torch.tensor([best], dtype=torch.long, device=tokens.device)
    return Verdict(tokens=torch.cat([accepted, last]), num_accepted=len(path),
                   acceptance=torch.tensor(compared), path=tuple(path))
