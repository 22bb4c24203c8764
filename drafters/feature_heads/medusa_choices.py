"""Medusa choice trees (Cai et al. 2024, "Medusa", §2.1.2): paths of top-k ranks, one per head,
in the public `medusa_choices` format — (i,) is head 0's i-th most likely token, (i, j) head 1's
j-th under it, and so on. Validation, a default tree for any number of heads, and the node
layout a depth limit keeps; pure functions, no checkpoint needed."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

import torch

__all__ = ["DEFAULT_MAX_NODES", "DEFAULT_MAX_RANK", "DEFAULT_NODES_PER_HEAD", "HEAD_DECAY", "HEAD_TOP1", "PRESETS",
           "RANK_DECAY", "ChoiceLayout", "check_medusa_choices", "choice_layout", "default_medusa_choices"]


# The default tree's assumed accuracies: head h's top-1 is right with probability
# HEAD_TOP1 * HEAD_DECAY**h (0.6, 0.42, 0.29, ...) and its rank-i candidate with that times
# RANK_DECAY**i, so head 0's top-5 covers ~0.8. Cai et al. 2024 (§2.1.2) motivate trees with
# the first head's top-1 accuracy near 60% and its top-5 above 80%; later heads, predicting
# further ahead, are less accurate. A path's score is the product along it.
HEAD_TOP1, HEAD_DECAY, RANK_DECAY = 0.6, 0.7, 0.25
DEFAULT_NODES_PER_HEAD, DEFAULT_MAX_NODES, DEFAULT_MAX_RANK = 8, 24, 10
PRESETS = ("default",)


def default_medusa_choices(num_heads: int, nodes: int | None = None,
                           max_rank: int = DEFAULT_MAX_RANK) -> list[tuple[int, ...]]:
    """The `nodes` paths (default min(8 * num_heads, 24): 24 for 3 heads) with the highest
    assumed acceptance (HEAD_TOP1, HEAD_DECAY, RANK_DECAY), ranks below `max_rank`, in
    breadth-first order (by length, then ranks). Scores fall along every path, so the set is
    closed under prefixes. Pure: no checkpoint needed."""
    for field, value in (("num_heads", num_heads), ("max_rank", max_rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"medusa: {field} must be an int >= 1, got {value!r}")
    if nodes is None:
        nodes = min(DEFAULT_NODES_PER_HEAD * num_heads, DEFAULT_MAX_NODES)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"medusa: nodes must be an int >= 1, got {nodes!r}")

    def score(path: tuple[int, ...]) -> float:
        value = 1.0
        for head, rank in enumerate(path):
            value *= HEAD_TOP1 * HEAD_DECAY**head * RANK_DECAY**rank
        return value

    # Best first: each path is generated once, by its previous sibling or (rank 0) its parent.
    frontier: list[tuple[float, int, tuple[int, ...]]] = [(-score((0,)), 1, (0,))]
    chosen: list[tuple[int, ...]] = []
    while frontier and len(chosen) < nodes:
        _, _, path = heapq.heappop(frontier)
        chosen.append(path)
        followers = [path + (0,)] if len(path) < num_heads else []
        if path[-1] + 1 < max_rank:
            followers.append(path[:-1] + (path[-1] + 1,))
        for follower in followers:
            heapq.heappush(frontier, (-score(follower), len(follower), follower))
    return sorted(chosen, key=lambda path: (len(path), path))


def check_medusa_choices(choices: object, num_heads: int, vocab_size: int) -> list[tuple[int, ...]]:
    """Validate Medusa choices (a list of paths of top-k ranks) against a checkpoint of
    `num_heads` heads and a vocabulary of `vocab_size`; return them breadth-first as tuples.

    Raises ValueError naming the first bad entry: not a non-empty list of ints, a rank < 0 or
    >= vocab_size, deeper than the heads, given twice, or missing one of its prefixes.
    """
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence) or not choices:
        raise ValueError(f"medusa: medusa_choices must be a non-empty list of paths such as "
                         f"[(0,), (1,), (0, 0)], or one of {list(PRESETS)}, got {choices!r}")
    paths: list[tuple[int, ...]] = []
    for entry in choices:
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or not entry or not all(
                isinstance(rank, Integral) and not isinstance(rank, bool) for rank in entry):
            raise ValueError(f"medusa: medusa_choices entry {entry!r} is not a non-empty tuple of ints "
                             "(top-k ranks, one per head)")
        path = tuple(int(rank) for rank in entry)
        bad = [rank for rank in path if not 0 <= rank < vocab_size]
        if bad:
            raise ValueError(f"medusa: medusa_choices entry {path} has rank {bad[0]} outside "
                             f"[0, {vocab_size}) (the vocabulary)")
        if len(path) > num_heads:
            raise ValueError(f"medusa: medusa_choices entry {path} is {len(path)} deep but the checkpoint "
                             f"has {num_heads} heads")
        if path in paths:
            raise ValueError(f"medusa: medusa_choices entry {path} is given twice")
        paths.append(path)
    present = set(paths)
    for path in paths:
        for cut in range(1, len(path)):
            if path[:cut] not in present:
                raise ValueError(f"medusa: medusa_choices entry {path} needs its prefix {path[:cut]}, "
                                 "which is missing")
    return sorted(paths, key=lambda path: (len(path), path))


@dataclass(frozen=True)
class ChoiceLayout:
    """The tree for one depth limit: which head and rank gives each node, and its parent."""

    count: int  # heads used
    ranks: int  # top-k width needed
    heads: torch.Tensor  # (n,) long
    rank_of: torch.Tensor  # (n,) long
    parents: torch.Tensor  # (n,) long


def choice_layout(choices: list[tuple[int, ...]], depth: int, device: torch.device) -> ChoiceLayout:
    """The nodes of `choices` (breadth-first, prefix-closed) at most `depth` deep, as tensors."""
    kept = [path for path in choices if len(path) <= depth]  # breadth-first, prefix closed
    index = {path: i for i, path in enumerate(kept)}
    parents = [index[path[:-1]] if len(path) > 1 else -1 for path in kept]

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return ChoiceLayout(count=max((len(path) for path in kept), default=0),
                   ranks=max((rank + 1 for path in kept for rank in path), default=0),
                   heads=tensor([len(path) - 1 for path in kept]), rank_of=tensor([path[-1] for path in kept]),
                   parents=tensor(parents))
