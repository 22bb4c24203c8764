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
from typing import Any, ClassVar

import torch

from specdec.protocols import DraftContext
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
        self.pool = NgramPool(self.guesses)
        self.levels: list[list[int]] = []
        self._ids: list[int] = []  # the committed ids seen so far (host copy)
        self._pooled = 0  # the first start whose context n-gram is not pooled yet
        self._layouts: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def max_draft_nodes(self, k: int) -> int:
        return (self.guesses if self.tree else 1) * min(k, self.ngram - 1)

    def extra_rows(self) -> int:
        return self.window * (self.ngram - 1)

    def prefill(self, ctx: DraftContext) -> None:
        self.pool = NgramPool(self.guesses)
        self._ids, self._pooled = [], 0
        prompt = ctx.tokens.tolist()
        draw = random.Random(self.seed)
        self.levels = [[draw.choice(prompt) for _ in range(self.window)]]
        self._see(prompt)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        if ctx.tokens.shape[0] < len(self._ids) or not self.levels:  # a new sequence without prefill
            self.prefill(ctx)
        self._see(ctx.tokens[len(self._ids) :].tolist())
        device = ctx.tokens.device
        paths = [list(gram[:k]) for gram in self.pool.get(self._ids[-1])[: self.guesses if self.tree else 1]]
        if len({tuple(path) for path in paths}) > 1:
            tokens, parents = tree_from_paths(paths)
            draft_parents: torch.Tensor | None = torch.tensor(parents, dtype=torch.long, device=device)
        else:  # nothing, or one distinct continuation: a chain
            tokens, draft_parents = (paths[0] if paths else []), None
        return Draft(torch.tensor(tokens, dtype=torch.long, device=device), parents=draft_parents,
                     extra=self._branch(device))

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        if ctx.extra_logits is None:  # the target could not run the branch: it stays as it was
            return
        top = (len(self.levels) - 1) * self.window
        new = ctx.extra_logits[top : top + self.window].argmax(dim=-1).tolist()  # (W,) at the top level
        for gram in shift_levels(self.levels, new, self.ngram):
            self.pool.add(gram)

    def _see(self, new_ids: list[int]) -> None:
        """Append committed ids; with pool_context, pool the N-grams that are now complete."""
        self._ids.extend(new_ids)
        if not self.pool_context:
            return
        last = len(self._ids) - self.ngram  # the last start of a complete N-gram
        for start in range(self._pooled, last + 1):
            self.pool.add(tuple(self._ids[start : start + self.ngram]))
        self._pooled = max(self._pooled, last + 1)

    def _branch(self, device: torch.device) -> ExtraRows:
        """The lookahead branch's rows for the levels held now."""
        key = (len(self.levels), device)
        if key not in self._layouts:
            self._layouts[key] = branch_layout(len(self.levels), self.window, device)
        positions, visible = self._layouts[key]
        tokens = torch.tensor([token for level in self.levels for token in level], dtype=torch.long, device=device)
        return ExtraRows(tokens, positions, visible)
