"""Retrieval drafting: propose what followed the context's longest suffix in a corpus (He et al.
2023, "REST: Retrieval-Based Speculative Decoding", arXiv 2311.08252).

Each step looks the last `max_match` down to `min_match` committed ids up in a suffix-array
datastore (`specdec.data.datastore`; `specdec datastore build`), reads the k ids after up to
`occurrences` of its occurrences, and counts every continuation prefix. As in REST, the tree is
the most frequent prefixes (`frequent_prefix_tree`): at most `nodes` of them, each parent at
least as frequent as its children, siblings most frequent first; `tree=False` drafts the most
frequent path alone, a chain.

Exact at any temperature: candidates are deterministic (no q; distinct siblings), so the shared
verifier accepts them by sample-and-match and the output follows plain sampling. REST's own
sampling mode (Medusa's typical acceptance) is lossy; this drafter is not.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from specdec.data.datastore import Datastore, open_datastore
from specdec.protocols import Capability, DraftContext, Rows
from specdec.types import Draft

__all__ = ["RetrievalDrafter", "frequent_prefix_tree"]


def frequent_prefix_tree(continuations: Sequence[tuple[Sequence[int], int]], nodes: int,
                         width: int | None = None) -> tuple[list[int], list[int]]:
    """The `nodes` most frequent prefixes of weighted continuations as a breadth-first trie
    (tokens, parents); `width` caps each node's children (1: the most frequent path).

    A prefix's frequency is the total count of the continuations it begins, so no node is more
    frequent than its parent, and taking prefixes by frequency (ties: first seen, the order of
    `continuations`) keeps every chosen node's parent. Siblings come most frequent first.
    """
    count: dict[tuple[int, ...], int] = {}
    seen: dict[tuple[int, ...], int] = {}
    for continuation, weight in continuations:
        for depth in range(1, len(continuation) + 1):
            prefix = tuple(continuation[:depth])
            count[prefix] = count.get(prefix, 0) + weight
            seen.setdefault(prefix, len(seen))
    kids: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for prefix in count:
        kids.setdefault(prefix[:-1], []).append(prefix)
    frontier = [(-count[p], seen[p], p) for p in kids.get((), [])]
    heapq.heapify(frontier)
    chosen: list[tuple[int, ...]] = []  # in the order taken: by frequency, then first seen
    taken: dict[tuple[int, ...], int] = {}  # children chosen per parent
    while frontier and len(chosen) < nodes:
        _, _, prefix = heapq.heappop(frontier)
        if width is not None and taken.get(prefix[:-1], 0) >= width:
            continue
        taken[prefix[:-1]] = taken.get(prefix[:-1], 0) + 1
        chosen.append(prefix)
        for child in kids.get(prefix, []):
            heapq.heappush(frontier, (-count[child], seen[child], child))
    rank = {prefix: i for i, prefix in enumerate(chosen)}
    index: dict[tuple[int, ...], int] = {(): -1}
    tokens: list[int] = []
    parents: list[int] = []
    for depth in range(1, max(map(len, chosen), default=0) + 1):  # breadth-first, grouped by parent
        for prefix in sorted((p for p in chosen if len(p) == depth), key=lambda p: (index[p[:-1]], rank[p])):
            index[prefix] = len(tokens)
            tokens.append(prefix[-1])
            parents.append(index[prefix[:-1]])
    return tokens, parents


def _positive(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"retrieval: {field} must be an int >= 1, got {value!r}")
    return value


class RetrievalDrafter:
    """REST: what followed the context's longest suffix in a datastore, as a tree by default.

    datastore: the directory `specdec datastore build` wrote (required). tree (default True):
    draft the `nodes` (default 32) most frequent continuation prefixes; False: the most frequent
    path. occurrences (default 64): how many occurrences of the match are read. max_match /
    min_match (16 / 2): the longest and shortest suffix looked up. tokenizer: the target's
    tokenizer (a directory, hub id or tokenizer object), checked against the datastore's
    fingerprint; without it prefill checks the vocabulary size only. verify (default True):
    check the datastore's checksums on opening.
    """

    name: ClassVar[str] = "retrieval"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.STATE, Capability.TREES})
    tree_options: ClassVar[dict[str, Any]] = {"tree": True}  # the options that make it draft trees (bench rows)

    @staticmethod
    def drafts_trees(options: dict[str, Any]) -> bool:
        """Whether these options make it draft trees: unless tree=False (trees are the default)."""
        return options.get("tree", True) is not False

    def __init__(self, datastore: str | Path | None = None, tree: bool = True, nodes: int = 32,
                 occurrences: int = 64, max_match: int = 16, min_match: int = 2, tokenizer: Any = None,
                 verify: bool = True) -> None:
        if datastore is None:
            raise ValueError("retrieval: the datastore option is required: the directory `specdec datastore build` "
                             "wrote, e.g. make_drafter('retrieval', datastore=DIR) or "
                             "--drafter retrieval:datastore=DIR")
        if not isinstance(datastore, (str, Path)):
            raise ValueError(f"retrieval: datastore must be a directory path, got {datastore!r}")
        for field, value in (("tree", tree), ("verify", verify)):
            if not isinstance(value, bool):
                raise ValueError(f"retrieval: {field} must be true or false, got {value!r}")
        self.nodes, self.occurrences = _positive("nodes", nodes), _positive("occurrences", occurrences)
        self.max_match, self.min_match = _positive("max_match", max_match), _positive("min_match", min_match)
        if min_match > max_match:
            raise ValueError(f"retrieval: min_match ({min_match}) must not exceed max_match ({max_match})")
        self.tree = tree
        self.datastore: Datastore = open_datastore(datastore, verify=verify)
        self._tokenizer_checked = tokenizer is not None
        if tokenizer is not None:
            if isinstance(tokenizer, (str, Path)):
                from specdec.checkpoints import load_tokenizer

                tokenizer = load_tokenizer(tokenizer)
            self.datastore.check_tokenizer(tokenizer)
        self._vocab_checked: int | None = None  # the target vocab size the datastore was checked against

    def max_draft_nodes(self, k: int) -> int:
        return min(self.nodes, k * self.occurrences) if self.tree else k

    def prefill(self, rows: Rows) -> None:
        self._check(rows[min(rows)])

    def commit(self, rows: Rows, accepted: Mapping[int, int]) -> None:
        """Nothing to roll back: each draft is looked up from the committed ids alone."""

    def _check(self, ctx: DraftContext) -> None:
        self.datastore.check_vocab(ctx.vocab_size, self._tokenizer_checked)
        self._vocab_checked = ctx.vocab_size

    def propose(self, rows: Rows, k: Mapping[int, int]) -> dict[int, Draft]:
        return {row: self._propose(ctx, k[row]) for row, ctx in rows.items()}

    def _propose(self, ctx: DraftContext, k: int) -> Draft:
        if ctx.vocab_size != self._vocab_checked:  # propose without prefill
            self._check(ctx)
        device = ctx.tokens.device
        if k < 1:
            return Draft(torch.zeros(0, dtype=torch.long, device=device))
        context = ctx.tokens[-self.max_match :].tolist()
        found = self.datastore.continuations(context, k, self.occurrences, self.min_match, self.max_match)
        tokens, parents = frequent_prefix_tree(found, self.max_draft_nodes(k), None if self.tree else 1)
        if parents == list(range(-1, len(parents) - 1)):  # nothing, or a single path: a chain
            return Draft(torch.tensor(tokens, dtype=torch.long, device=device))
        return Draft(torch.tensor(tokens, dtype=torch.long, device=device),
                     parents=torch.tensor(parents, dtype=torch.long, device=device))
