"""DDTree: the best token tree one block drafter's forward can give (Ringel and Romano 2026,
"Accelerating Speculative Decoding with Block Diffusion Draft Trees", arXiv 2604.12989).

A block drafter gives, from one forward, a distribution per depth d = 1 .. D of the token at that
depth, each given the context alone. Scoring a path by the product of its tokens' probabilities
(the sum of their log-probabilities), the tree of the N best-scoring prefixes is built
best-first: a heap holds candidate nodes, each the r-th most likely token of its depth under a
chosen parent; popping the best makes it a node and pushes its next sibling (rank r + 1, same
parent) and its first child (rank 0 of depth d + 1). A prefix's score falls as it grows or as a
rank goes down, so every candidate pushed scores no better than the node that pushed it, and the
nodes come out in order of score, parents before children: the tree is prefix-closed and its
nodes topologically ordered. Each depth offers at most its K most likely tokens.
"""

from __future__ import annotations

import heapq

import torch

__all__ = ["best_prefixes"]


def best_prefixes(log_probs: torch.Tensor, top_k: int, budget: int) -> tuple[list[int], list[int]]:
    """The tree of the `budget` best prefixes: log_probs [D, V] (depth d + 1's log-probabilities in
    row d) -> (tokens [n], parents [n], -1 the root) with n = min(budget, the prefixes there are),
    nodes in the order they were chosen (best first, every parent before its children)."""
    depths = log_probs.shape[0]
    if depths == 0 or budget <= 0:
        return [], []
    width = min(top_k, log_probs.shape[1])
    scores, ids = log_probs.float().topk(width, dim=-1)  # (D, K) each, best first
    score, token = scores.tolist(), ids.tolist()
    tokens: list[int] = []
    parents: list[int] = []
    heap: list[tuple[float, int, int, int, int]] = [(-score[0][0], 0, -1, 0, 0)]  # (-score, tie, parent, depth, rank)
    pushed = 1
    while heap and len(tokens) < budget:
        negative, _, parent, depth, rank = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(token[depth][rank])
        parents.append(parent)
        total = -negative
        if rank + 1 < width:  # its next sibling: the same parent, the next most likely token
            heapq.heappush(heap, (-(total - score[depth][rank] + score[depth][rank + 1]), pushed, parent, depth, rank + 1))
            pushed += 1
        if depth + 1 < depths:  # its first child
            heapq.heappush(heap, (-(total + score[depth + 1][0]), pushed, node, depth + 1, 0))
            pushed += 1
    return tokens, parents
