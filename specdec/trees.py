"""Token trees as parent-index lists: the pure bookkeeping shared by the verifier, the target
adapter and the tree drafters (no model calls).

A tree draft of n nodes is `parents: list[int]` with parents[i] < i, and -1 for a child of the
root, the last committed token. A verify forward feeds n + 1 rows: row 0 is the root, row i + 1
is node i. Row r attends to the cached prefix and to the rows of its own ancestors and itself
(SpecInfer, Miao et al. 2024, "SpecInfer: Accelerating Large Language Model Serving with
Tree-based Speculative Inference and Verification", §4.2: tree attention), and sits at position
`cached + depth(r)` so every path reads as an ordinary sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.types import ExtraRows

__all__ = ["additive_mask", "ancestor_mask", "chain_parents", "children", "depths", "first_path", "path_to",
           "tree_from_paths", "verify_layout"]


def chain_parents(n: int) -> list[int]:
    """The parents of a chain of n tokens: [-1, 0, 1, ..., n - 2]."""
    return list(range(-1, n - 1))


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (a child of the root has depth 1)."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def children(parents: Sequence[int]) -> list[list[int]]:
    """children[r]: the nodes whose parent is row r - 1 (r = 0: the root), in draft order."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        out[parent + 1].append(node)
    return out


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """The nodes from the root's child down to `node` (empty for node = -1)."""
    path: list[int] = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def first_path(parents: Sequence[int]) -> list[int]:
    """The chain of first children: node 0, its first child, that one's first child, ..."""
    kids = children(parents)
    path: list[int] = []
    row = 0
    while kids[row]:
        node = kids[row][0]
        path.append(node)
        row = node + 1
    return path


def ancestor_mask(parents: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """Bool [n + 1, n + 1]: entry (r, c) is True when row c is row r or one of its ancestors.

    Row 0 is the root; row i + 1 is node i.
    """
    n = len(parents)
    rows: list[int] = []
    cols: list[int] = []
    for node in range(n):
        ancestor = node
        while ancestor >= 0:  # the node itself, then each ancestor: depth <= k entries
            rows.append(node + 1)
            cols.append(ancestor + 1)
            ancestor = parents[ancestor]
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool, device=device)
    mask[:, 0] = True
    mask[torch.tensor(rows, dtype=torch.long, device=device), torch.tensor(cols, dtype=torch.long, device=device)] = True
    return mask


def verify_layout(parents: Sequence[int], width: int, extra: ExtraRows | None = None,
                  device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The new rows of a verify forward: the root, the tree's n nodes padded to `width` rows (pad
    nodes hang off the root, seen by no other row) and then the m extra rows (`ExtraRows`: each
    sees the root, itself and the extra rows its `visible` names; no tree row sees them).

    Returns visible [width + m, width + m] (True = attend) among these rows, on top of the cached
    prefix every row sees, and each row's position offset after the root [width + m] (a node's
    depth, an extra row's own offset). A chain is the tree `chain_parents(n)`.
    """
    padded = list(parents) + [-1] * (width - len(parents) - 1)
    m = 0 if extra is None else extra.tokens.shape[0]
    visible = torch.zeros(width + m, width + m, dtype=torch.bool, device=device)
    visible[:width, :width] = ancestor_mask(padded, device=device)  # (width, width)
    offsets = torch.tensor([0] + depths(padded), dtype=torch.long, device=device)  # (width,)
    if extra is not None:
        visible[width:, 0] = True  # the root
        visible[width:, width:] = extra.visible.to(device) | torch.eye(m, dtype=torch.bool, device=device)  # (m, m)
        offsets = torch.cat([offsets, extra.positions.to(device)])  # (width + m,)
    return visible, offsets


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool [m, C + m] (True = attend) -> the additive 4D mask [1, 1, m, C + m] attention layers take."""
    additive = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return additive.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def tree_from_paths(paths: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Merge token sequences into a trie: (tokens, parents), shared prefixes stored once.

    Nodes come in breadth-first order (by depth, then first appearance), so siblings keep the
    order of the paths that introduced them.
    """
    index: dict[tuple[int, ...], int] = {}
    tokens: list[int] = []
    parents: list[int] = []
    for depth in range(1, max((len(path) for path in paths), default=0) + 1):
        for path in paths:
            prefix = tuple(path[:depth])
            if len(prefix) == depth and prefix not in index:
                index[prefix] = len(tokens)
                tokens.append(prefix[-1])
                parents.append(index[prefix[:-1]] if depth > 1 else -1)
    return tokens, parents
