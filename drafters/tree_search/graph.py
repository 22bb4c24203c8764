"""EAGLE-2's dynamic top-k tree (`specdec.drafters.tree_search.dynamic.grow_tree`) as tensor operations of
fixed shape, so that a drafter's whole tree (its depth-by-depth forwards, the top-k expansions,
the choice of the nodes to expand and the final reranking) runs as one step: one compiled graph
and no reads back to the host until the loop reads the draft (Li et al. 2024, "EAGLE-2", §4).

It builds the same tree as the host version: the root's top_k children form depth 1; at each
further depth the top_k nodes of the newest depth by value (ties to the node made first) run
through the drafter in one forward of top_k rows and each gets its top_k children; of all nodes
made, the `total_tokens` of highest value are kept, in creation order. Values are sums of
log-probabilities at the tree's value temperature, so a child never outranks its parent and the
kept set holds every kept node's ancestors.

Node ids follow creation order: depth 1 is 0..top_k-1, then each expansion adds top_k * top_k
children, parent by parent. Expansion e (1-based) writes its top_k rows into the drafter's cache
after the `real` committed entries, at columns real + (e - 1) * top_k + slot; each row sees the
committed entries, the rows of its ancestors and itself.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.drafters.tree_search.dynamic import DynamicTree

__all__ = ["TreeExpand", "TreesExpand", "expansions", "topk_tree", "topk_trees", "tree_depth"]

# expand(e, tokens [K], states (tuple of [K, ...]), positions [K], mask [1, 1, K, W]) -> (states, logits [K, V]):
# the drafter's forward of the K chosen nodes of expansion e (1-based), appending K cache entries
TreeExpand = Callable[[int, torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor],
                      tuple[tuple[torch.Tensor, ...], torch.Tensor]]


def tree_depth(tree: DynamicTree, k: int) -> int:
    """The tree's levels for a draft of at most k: min(depth, k)."""
    return min(k, tree.depth) if tree.depth is not None else k


def expansions(tree: DynamicTree, depth: int) -> int:
    """Cache entries a tree of `depth` levels writes: top_k rows per expanded depth."""
    return max(depth - 1, 0) * tree.top_k


def _log_values(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def _best(values: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the `count` largest values along the last dimension ([.., M]), ties to the lower
    index, in ascending order: [.., count]."""
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :count]
    return torch.sort(order, dim=-1).values


def topk_tree(expand: TreeExpand, root_logits: torch.Tensor, root_states: tuple[torch.Tensor, ...],
              real: torch.Tensor, start: torch.Tensor, width: int | None, tree: DynamicTree, depth: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The dynamic tree from the root's logits [V] and the drafter's states there ([1, ...] each).

    real: 0-d, the committed entries in the drafter's cache; start: 0-d, the position before
    depth 1 (a depth-d node runs at start + d); width: the columns of the drafter's masks (a static
    cache's capacity), or None for a cache that grows (run eagerly): each mask then spans the
    entries so far and the forward's rows.
    Returns tokens [n] and parents [n] (-1 = the root), n = min(total_tokens, nodes made).
    """
    k = tree.top_k

    def committed(e: int) -> torch.Tensor:  # (1, W): the committed entries every node sees
        columns = torch.arange(width if width is not None else int(real) + e * k, device=root_logits.device)
        return (columns < real)[None]

    def one(e: int, tokens: torch.Tensor, states: tuple[torch.Tensor, ...], positions: torch.Tensor,
            mask: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        out, logits = expand(e, tokens[0], tuple(state[0] for state in states), positions[0], mask)
        return tuple(state[None] for state in out), logits[None]

    tokens, parents = topk_trees(one, root_logits[None], root_states, committed, real, start[None], tree, depth)
    return tokens[0], parents[0]


# expand(e, tokens [B, K], states (tuple of [B, K, ...]), positions [B, K], mask [B, 1, K, W]) ->
# (states, logits [B, K, V]): the drafter's forward of each batch row's K chosen nodes of expansion e
TreesExpand = Callable[[int, torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor],
                       tuple[tuple[torch.Tensor, ...], torch.Tensor]]


def topk_trees(expand: TreesExpand, root_logits: torch.Tensor, root_states: tuple[torch.Tensor, ...],
               committed: Callable[[int], torch.Tensor], base: torch.Tensor | int, start: torch.Tensor,
               tree: DynamicTree, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`topk_tree` for B rows at once: each row's tree from its root's logits [B, V] and states
    ([B, ...] each). committed(e): the columns every node of expansion e sees in each row [B, W]
    (its committed entries); base: the column of expansion 1's first row (expansion e writes its
    K rows at base + (e - 1) * K + slot in every row); start [B]: each row's position before
    depth 1. Returns tokens [B, n] and parents [B, n]."""
    k = tree.top_k
    device = root_logits.device
    batch = root_logits.shape[0]
    dtype = root_states[0].dtype
    best, ids = _log_values(root_logits, tree.value_temperature).topk(k, dim=-1)  # (B, K) each
    tokens, values = [ids], [best]
    parents = [torch.full((batch, k), -1, dtype=torch.long, device=device)]
    frontier = torch.arange(k, device=device).expand(batch, k)  # (B, K) the nodes expanded next (their ids)
    frontier_tokens, frontier_values = ids, best  # (B, K) each
    states = tuple(state[:, None].expand(batch, k, *state.shape[1:]) for state in root_states)  # the parents' states
    ancestors = torch.empty(batch, k, 0, dtype=torch.long, device=device)  # (B, K, e - 1) cache columns of ancestors
    made = k
    for e in range(1, depth):
        own = base + (e - 1) * k + torch.arange(k, device=device)  # (K,) this expansion's cache columns
        seen = committed(e)  # (B, W)
        columns = torch.arange(seen.shape[1], device=device)  # (W,)
        visible = seen[:, None, :] | (columns[None, None] == own[None, :, None])  # (B, K, W)
        visible = visible | (columns[None, None, None] == ancestors[..., None]).any(dim=2)
        mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(~visible, torch.finfo(dtype).min)
        positions = (start[:, None] + e).expand(batch, k)  # (B, K)
        states, logits = expand(e, frontier_tokens, states, positions, mask[:, None])
        best, ids = _log_values(logits, tree.value_temperature).topk(k, dim=-1)  # (B, K, K) each
        child_values = (frontier_values[:, :, None] + best).reshape(batch, -1)  # (B, K * K), parent by parent
        child_tokens = ids.reshape(batch, -1)
        tokens.append(child_tokens)
        values.append(child_values)
        parents.append(frontier.repeat_interleave(k, dim=1))
        if e + 1 < depth:  # the next expansion's nodes: the best k children, in creation order
            chosen = _best(child_values, k)  # (B, K) among the children
            slot = chosen // k  # the frontier row each was made from
            frontier = made + chosen
            frontier_tokens, frontier_values = child_tokens.gather(1, chosen), child_values.gather(1, chosen)
            states = tuple(_rows(state, slot) for state in states)
            ancestors = torch.cat([_rows(ancestors, slot), own[slot][..., None]], dim=2)
        made += k * k
    all_tokens, all_values, all_parents = torch.cat(tokens, 1), torch.cat(values, 1), torch.cat(parents, 1)  # (B, M)
    kept = _best(all_values, min(tree.total_tokens, made))  # (B, n)
    place = torch.full((batch, made), -1, dtype=torch.long, device=device)
    place = place.scatter(1, kept, torch.arange(kept.shape[1], device=device).expand(batch, -1))
    parent = all_parents.gather(1, kept)
    return all_tokens.gather(1, kept), torch.where(parent >= 0, place.gather(1, parent.clamp(min=0)), -1)


def _rows(state: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """state [B, K, ...] at the rows index [B, K] names, per batch row."""
    shape = index.shape + state.shape[2:]
    return state.gather(1, index.reshape(*index.shape, *([1] * (state.dim() - 2))).expand(shape))
