"""Lookahead decoding: Jacobi iterations on a window of guessed tokens, run in the same target
forward as the verify, feed a pool of n-grams that later drafts are taken from (Fu et al. 2024,
"Break the Sequential Dependency of LLM Inference Using Lookahead Decoding", arXiv 2402.02057).

Options: the window W (`window`), the n-gram size N (`ngram`), the guess set G (`guesses`,
default W) and `tree`. Each step has two branches.

- **Lookahead branch** (the drafter's extra rows, `specdec.types.ExtraRows`): N - 1 levels of W
  tokens. Token (l, j) (level l, column j) sits at offset l + j + 1 after the last committed
  token (the root, offset 0) and sees the committed prefix, the root, the level-0 tokens of
  columns <= j and its own column's tokens (l', j), 1 <= l' <= l: each column is a contiguous
  sequence root, (0, 0..j), (1, j), ..., (l, j). After the forward the target's argmax at each
  top-level row (N - 2, j) is a new token new_j; the n-gram (0, j), (1, j), ..., (N - 2, j),
  new_j goes into the pool under its first token, and the levels shift: level 0 is dropped and
  the new tokens become the top level. The window is re-anchored after every step at the new
  last committed token, however many tokens were accepted. The argmax is used at every
  temperature: the branch only makes guesses.
- **Verification branch** (the draft): up to G pooled n-grams whose first token is the last
  committed token, most recent first; their N - 1 following tokens (cut to k) are the
  candidates. With `tree` they are merged into a trie (`specdec.trees.tree_from_paths`);
  without, the first one is a chain.

Warm-up: level 0 starts as W tokens drawn from the prompt with `random.Random(seed)` (random
guesses, as in the paper, but from the tokens the text is likeliest to reuse; a fixed seed, so
one prompt gives one run, and the verifier's random stream is untouched). For the first N - 2
steps the window has fewer levels: each step's argmax at its top level is appended as a new
level, and nothing is pooled until all N - 1 levels are there (the paper's warm-up).

With `pool_context` (default) the pool is also seeded with every N-gram of the committed text,
prompt and accepted output, as they appear (prompt lookup keyed by one token). Those are
inserted after the step's Jacobi n-grams, so a key's most recent real continuation comes first.

Exactness: the candidates are deterministic (no q); trie siblings are distinct, verified by
sample-and-match, so the output is exactly the target's at any temperature (the public
implementation's sampling mode verifies differently; this one is exact). The extra rows
see no draft node and no node sees them, so they never change the verdict; the cache keeps only
the accepted path. Targets that cannot run a tree forward (linear attention) drop the extra
rows (the loop warns once); the drafter then drafts from its context n-grams only.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from specdec.protocols import Capability, DraftContext, Rows
from specdec.trees import tree_from_paths
from specdec.types import Draft, ExtraRows

__all__ = ["LookaheadDrafter", "NgramPool", "branch_layout", "shift_levels"]


def branch_layout(levels: int, window: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Position offsets [L * W] and visibility [L * W, L * W] of a lookahead branch of L levels
    of W tokens, row l * W + j holding token (l, j) (see the module docstring)."""
    level = torch.arange(levels, device=device).repeat_interleave(window)  # (L*W,)
    column = torch.arange(window, device=device).repeat(levels)  # (L*W,)
    positions = level + column + 1  # (L*W,)
    sees_level0 = (level[None, :] == 0) & (column[None, :] <= column[:, None])  # (L*W, L*W)
    sees_climb = (column[None, :] == column[:, None]) & (level[None, :] >= 1) & (level[None, :] <= level[:, None])
    return positions, sees_level0 | sees_climb


def shift_levels(levels: list[list[int]], new: list[int], ngram: int) -> list[tuple[int, ...]]:
    """Add the new top-level tokens to `levels` (in place) and return the n-grams they complete.

    While fewer than N - 1 levels are held (warm-up), `new` becomes one more level and nothing
    is returned. Then column j gives the n-gram (0, j), ..., (N - 2, j), new[j], and the levels
    shift: level 0 is dropped and `new` becomes the top level.
    """
    if len(levels) < ngram - 1:
        levels.append(list(new))
        return []
    grams = [tuple(level[j] for level in levels) + (token,) for j, token in enumerate(new)]
    del levels[0]
    levels.append(list(new))
    return grams


class NgramPool:
    """Up to `size` continuations (the N - 1 tokens after a key) per first token, most recent first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.grams: dict[int, list[tuple[int, ...]]] = {}

    def add(self, gram: tuple[int, ...]) -> None:
        """Pool gram[1:] under gram[0]; an entry already there moves to the front."""
        entries = self.grams.setdefault(gram[0], [])
        continuation = gram[1:]
        if continuation in entries:
            entries.remove(continuation)
        entries.insert(0, continuation)
        del entries[self.size :]

    def get(self, key: int) -> list[tuple[int, ...]]:
        return self.grams.get(key, [])


class LookaheadDrafter:
    """Lookahead decoding: Jacobi rows of a `window` x (`ngram` - 1) branch ride in the verify
    forward and pool n-grams; drafts are the pooled continuations of the last token."""

    name: ClassVar[str] = "lookahead"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.STATE, Capability.TREES,
                                                               Capability.EXTRA_ROWS})
    tree_options: ClassVar[dict[str, Any]] = {"tree": True}  # the options that make it draft trees (bench rows)

    @staticmethod
    def drafts_trees(options: dict[str, Any]) -> bool:
        """Whether these options make it draft trees (`tree` with more than one guess)."""
        guesses = options.get("guesses") or options.get("window", 5)
        return options.get("tree") is True and isinstance(guesses, int) and guesses > 1

    def __init__(self, window: int = 5, ngram: int = 4, guesses: int | None = None, tree: bool = False,
                 pool_context: bool = True, seed: int = 0) -> None:
        for field, value, low in (("window", window, 1), ("ngram", ngram, 2), ("guesses", guesses, 1),
                                  ("seed", seed, 0)):
            if value is None and field == "guesses":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"lookahead: {field} must be an int >= {low}, got {value!r}")
        for field, flag in (("tree", tree), ("pool_context", pool_context)):
            if not isinstance(flag, bool):
                raise ValueError(f"lookahead: {field} must be True or False, got {flag!r}")
        self.window, self.ngram, self.tree, self.pool_context, self.seed = window, ngram, tree, pool_context, seed
        self.guesses = window if guesses is None else guesses
        self._windows: dict[int, _Window] = {}  # each row's Jacobi levels and n-gram pool
        self._layouts: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def pool(self) -> NgramPool:
        """Row 0's pool (the pool of a generation of one prompt)."""
        return self._windows[0].pool

    @property
    def levels(self) -> list[list[int]]:
        """Row 0's Jacobi levels."""
        return self._windows[0].levels

    def max_draft_nodes(self, k: int) -> int:
        return (self.guesses if self.tree else 1) * min(k, self.ngram - 1)

    def extra_rows(self) -> int:
        return self.window * (self.ngram - 1)

    def prefill(self, rows: Rows) -> None:
        for row, ctx in rows.items():
            self._start(row, ctx)

    def _start(self, row: int, ctx: DraftContext) -> _Window:
        prompt = ctx.tokens.tolist()
        draw = random.Random(self.seed)
        window = self._windows[row] = _Window(NgramPool(self.guesses), [[draw.choice(prompt) for _ in range(self.window)]])
        self._see(window, prompt)
        return window

    def propose(self, rows: Rows, k: Mapping[int, int]) -> dict[int, Draft]:
        return {row: self._propose(row, ctx, k[row]) for row, ctx in rows.items()}

    def _propose(self, row: int, ctx: DraftContext, k: int) -> Draft:
        window = self._windows.get(row)
        if window is None or ctx.tokens.shape[0] < len(window.ids):  # a new sequence without prefill
            window = self._start(row, ctx)
        self._see(window, ctx.tokens[len(window.ids) :].tolist())
        device = ctx.tokens.device
        paths = [list(gram[:k]) for gram in window.pool.get(window.ids[-1])[: self.guesses if self.tree else 1]]
        if len({tuple(path) for path in paths}) > 1:
            tokens, parents = tree_from_paths(paths)
            draft_parents: torch.Tensor | None = torch.tensor(parents, dtype=torch.long, device=device)
        else:  # nothing, or one distinct continuation: a chain
            tokens, draft_parents = (paths[0] if paths else []), None
        return Draft(torch.tensor(tokens, dtype=torch.long, device=device), parents=draft_parents,
                     extra=self._branch(window, device))

    def commit(self, rows: Rows, accepted: Mapping[int, int]) -> None:
        for row, ctx in rows.items():
            window = self._windows.get(row)
            if ctx.extra_logits is None or window is None:  # the target could not run the branch: it stays
                continue
            top = (len(window.levels) - 1) * self.window
            new = ctx.extra_logits[top : top + self.window].argmax(dim=-1).tolist()  # (W,) at the top level
            for gram in shift_levels(window.levels, new, self.ngram):
                window.pool.add(gram)

    def _see(self, window: _Window, new_ids: list[int]) -> None:
        """Append committed ids; with pool_context, pool the N-grams that are now complete."""
        window.ids.extend(new_ids)
        if not self.pool_context:
            return
        last = len(window.ids) - self.ngram  # the last start of a complete N-gram
        for start in range(window.pooled, last + 1):
            window.pool.add(tuple(window.ids[start : start + self.ngram]))
        window.pooled = max(window.pooled, last + 1)

    def _branch(self, window: _Window, device: torch.device) -> ExtraRows:
        """The lookahead branch's rows for the levels held now."""
        key = (len(window.levels), device)
        if key not in self._layouts:
            self._layouts[key] = branch_layout(len(window.levels), self.window, device)
        positions, visible = self._layouts[key]
        tokens = torch.tensor([token for level in window.levels for token in level], dtype=torch.long, device=device)
        return ExtraRows(tokens, positions, visible)


@dataclass
class _Window:
    """One row's lookahead state: its n-gram pool, its Jacobi levels, the committed ids seen so far
    (a host copy) and the first start whose context n-gram is not pooled yet."""

    pool: NgramPool
    levels: list[list[int]]
    ids: list[int] = field(default_factory=list)
    pooled: int = 0
