"""Prompt lookup decoding: propose the tokens that followed an earlier occurrence of the
context's last n tokens (Saxena 2023, "Prompt Lookup Decoding"; Yang et al. 2023, "Inference
with Reference: Lossless Acceleration of Large Language Models").

Tries n = max_ngram down to min_ngram; for the longest n with a match, takes the most recent
match that has a continuation. Deterministic: the draft is a one-hot q. An index of n-grams,
updated with each committed token, makes every lookup O(max_ngram) however long the context.

With `branches` > 1 the draft is a token tree: the continuations after up to `branches`
different earlier matches (the latest first, longest n first, then shorter n while fewer were
found), merged as a trie (`specdec.trees.tree_from_paths`), so one verify forward tries
several of the context's earlier futures at once. The first path is the branches = 1 draft.
Identical continuations add nothing; a single distinct one is proposed as a plain chain. The
siblings are distinct deterministic candidates, verified losslessly by sample-and-match.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from specdec.protocols import Capability, DraftContext, Rows
from specdec.trees import tree_from_paths
from specdec.types import Draft

__all__ = ["NgramDrafter", "NgramIndex"]


class NgramIndex:
    """The latest start of every n-gram (min_n <= n <= max_n) that has a following token.

    With branches > 1 each start also remembers the previous start of the same n-gram (one
    array entry per position and n), so the `branches` most recent matches are a short walk.
    """

    def __init__(self, min_n: int, max_n: int, branches: int = 1) -> None:
        self.min_n, self.max_n, self.branches = min_n, max_n, branches
        self.ids: list[int] = []
        self._latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        # _previous[n][s]: the start before s of the n-gram starting at s (-1: none); branches > 1 only
        self._previous: dict[int, array] = {n: array("q") for n in range(min_n, max_n + 1)} if branches > 1 else {}

    def extend(self, new_ids: list[int]) -> None:
        """Append ids; n-grams that now have a continuation are indexed, later starts winning."""
        old_length = len(self.ids)
        self.ids.extend(new_ids)
        ids, last = self.ids, len(self.ids) - 1  # a start s has a continuation when s + n <= last
        for n, latest in self._latest.items():
            starts = range(max(0, old_length - n), last - n + 1)
            if not self._previous:
                for start in starts:
                    latest[tuple(ids[start : start + n])] = start
                continue
            previous = self._previous[n]  # len(previous) == the first start not yet indexed
            for start in starts:
                gram = tuple(ids[start : start + n])
                previous.append(latest.get(gram, -1))
                latest[gram] = start

    def continuation(self, k: int) -> list[int]:
        """k ids copied from after the latest earlier match of the last n ids, longest n first.

        The copy may run into the ids it is producing (as in LZ77), so a match close to the end
        of a periodic context still continues the period for all k tokens.
        """
        ids = self.ids
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            start = self._latest[n].get(tuple(ids[len(ids) - n :]))
            if start is not None:
                return self._copy(start + n, k)
        return []

    def continuations(self, k: int) -> list[list[int]]:
        """Up to `branches` distinct k-id continuations, each copied (LZ77-style) from after a
        different earlier match of the context's suffix: for n from the longest down, the
        latest `branches` starts of the last n ids, latest first, not counting a start that
        continues at a position a longer match already used (at most `branches` per n longer
        ones, so the walk stays short). The first one is `continuation(k)`."""
        if self.branches == 1:
            draft = self.continuation(k)
            return [draft] if draft else []
        ids = self.ids
        used: set[int] = set()  # continuation positions already copied from
        paths: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            start = self._latest[n].get(tuple(ids[len(ids) - n :]), -1)
            previous = self._previous[n]
            fresh = 0  # matches of this n at unused positions (walked past the used ones)
            while start >= 0 and fresh < self.branches:
                if start + n not in used:
                    fresh += 1
                    used.add(start + n)
                    path = self._copy(start + n, k)
                    if tuple(path) not in seen:
                        seen.add(tuple(path))
                        paths.append(path)
                        if len(paths) == self.branches:
                            return paths
                start = previous[start]
        return paths

    def _copy(self, position: int, k: int) -> list[int]:
        """k ids from `position` on; a tail shorter than k repeats (the copy reads its own output)."""
        source = self.ids[position : position + k]  # at least one id: the match has a continuation
        return [source[i % len(source)] for i in range(k)]


class NgramDrafter:
    """Prompt lookup with n-grams of `max_ngram` down to `min_ngram` tokens; `branches` > 1
    proposes a tree of the continuations of several earlier matches."""

    name: ClassVar[str] = "ngram"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.STATE, Capability.TREES})
    tree_options: ClassVar[dict[str, Any]] = {"branches": 4}  # the options that make it draft trees (bench rows)

    @staticmethod
    def drafts_trees(options: dict[str, Any]) -> bool:
        """Whether these options make it draft trees (more than one branch)."""
        branches = options.get("branches", 1)
        return isinstance(branches, int) and not isinstance(branches, bool) and branches > 1

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, branches: int = 1) -> None:
        for field, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram), ("branches", branches)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ngram: {field} must be an int >= 1, got {value!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"ngram: min_ngram ({min_ngram}) must not exceed max_ngram ({max_ngram})")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.branches = branches
        self._indexes: dict[int, NgramIndex] = {}  # each row's index of its committed ids

    def max_draft_nodes(self, k: int) -> int:
        return self.branches * k  # a trie of at most `branches` continuations of k tokens

    def prefill(self, rows: Rows) -> None:
        self._indexes = {row: NgramIndex(self.min_ngram, self.max_ngram, self.branches) for row in rows}

    def commit(self, rows: Rows, accepted: Mapping[int, int]) -> None:
        """Nothing to roll back: each row's index takes the committed ids at its next propose."""

    def propose(self, rows: Rows, k: Mapping[int, int]) -> dict[int, Draft]:
        return {row: self._propose(row, ctx, k[row]) for row, ctx in rows.items()}

    def _propose(self, row: int, ctx: DraftContext, k: int) -> Draft:
        index = self._indexes.get(row)
        if index is None or ctx.tokens.shape[0] < len(index.ids):  # a new sequence without prefill: start over
            index = self._indexes[row] = NgramIndex(self.min_ngram, self.max_ngram, self.branches)
        index.extend(ctx.tokens[len(index.ids) :].tolist())
        device = ctx.tokens.device
        if self.branches == 1:
            return Draft(torch.tensor(index.continuation(k), dtype=torch.long, device=device))
        paths = index.continuations(k)
        if len(paths) <= 1:  # nothing, or one distinct continuation: a chain
            return Draft(torch.tensor(paths[0] if paths else [], dtype=torch.long, device=device))
        tokens, parents = tree_from_paths(paths)
        return Draft(torch.tensor(tokens, dtype=torch.long, device=device),
                     parents=torch.tensor(parents, dtype=torch.long, device=device))
