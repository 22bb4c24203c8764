"""The target as the decode loop sees it: rows (prompts) that prefill, verify one draft each in one
forward, and keep the accepted path of it. Two runtimes serve it, one loop above both:

- `OneRow` (one prompt): the adapter's own cache (`CausalLM`), whose rollback is a length. Its
  chain verify is padded to k + 1 rows and read back once; a tree's logits are computed a row
  at a time, where the walk goes (`TreeLogits`); eager decoding of a full-attention target keeps
  transformers' dynamic cache, and a model that cannot run on a static cache (Mamba2 layers) is
  rolled back by replay. These are the fast paths of a batch of one.
- `specdec.runtime.batch_target.BatchLM` (several prompts): one static cache with holes, each row
  at its own positions, chains and trees laid out on the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.runtime.target import CausalLM
from specdec.runtime.tree_logits import TreeLogits
from specdec.types import Engine, ExtraRows

__all__ = ["Feed", "OneRow", "RowsTarget", "Verified"]


@dataclass(frozen=True)
class Feed:
    """One row's verify input: the row's committed ids [T] (the last, the root, at position T - 1,
    the only one not yet cached), its draft [n] (ids in the vocabulary), the draft's parents
    (None: a chain) and the drafter's extra rows (None: none; the target pads them to the
    declared count, `Engine.extra_rows`)."""

    committed: torch.Tensor
    draft: torch.Tensor
    parents: list[int] | None = None
    extra: ExtraRows | None = None

    @property
    def tree(self) -> bool:
        """Whether the feed runs as a tree (a draft with parents, or any draft with extra rows)."""
        return self.parents is not None or self.extra is not None


@dataclass(frozen=True)
class Verified:
    """What one verify forward gives the loop, per slot of the batch.

    rows[s]: slot s's logits over its verify rows (root first), `TreeLogits` (a row at a time
        where the model allows); None for an idle slot.
    logits: FloatTensor [S, R, V] of every slot's rows when the forward computed them all (the
        greedy verdicts of a batch take their argmax at once), else None.
    states[s]: slot s's hidden states of the layers the drafter reads, [R, m * H] (None: none).
    extra[s]: slot s's extra rows' logits [m, V] (None: none, or dropped).
    """

    rows: list[TreeLogits | None]
    logits: torch.Tensor | None
    states: list[torch.Tensor | None]
    extra: list[torch.Tensor | None]


class RowsTarget(Protocol):
    """The target of one generation, as the decode loop drives it."""

    @property
    def tree_obstacle(self) -> str | None:
        """Why its verify cannot take a tree (None: it can)."""

    @property
    def masked_obstacle(self) -> str | None:
        """Why its verify cannot take a drafter's extra rows (None: it can)."""

    def prefill(self, prompts: Sequence[torch.Tensor], layers: tuple[int, ...]) -> list[torch.Tensor | None]:
        """Cache each row's ids (its prompt but the last id); return each row's hidden states of `layers`
        [P_i, F] (None for none)."""

    def verify(self, feeds: Sequence[Feed | None], layers: tuple[int, ...]) -> Verified:
        """One forward over each slot's root and draft (None: an idle slot)."""

    def commit(self, paths: Sequence[Sequence[int] | None]) -> None:
        """After a verify, slot s keeps its rows paths[s] (0 = the root, node i = i + 1; ascending,
        a path from the root); None for an idle slot."""

    def select(self, slots: list[int]) -> None:
        """Keep only these slots, in this order (the others finished)."""

    def cache_length(self, slot: int) -> int:
        """Positions slot s's cache holds."""

    def tampered(self) -> str | None:
        """How a drafter changed the target's cache since the last prefill or keep (it ran
        ctx.target.forward), or None when it did not."""


class OneRow:
    """The target of a generation of one prompt, on the adapter's own cache."""

    def __init__(self, lm: CausalLM, engine: Engine) -> None:
        self.lm, self.engine = lm, engine
        self._base = 0  # the cache position of the last verify's root
        self._tree = False  # whether the last verify ran as a tree
        self._committed = 0  # the positions the cache held after the last prefill or keep

    @property
    def tree_obstacle(self) -> str | None:
        return self.lm.tree_obstacle

    @property
    def masked_obstacle(self) -> str | None:
        return self.lm.masked_obstacle

    def prefill(self, prompts: Sequence[torch.Tensor], layers: tuple[int, ...]) -> list[torch.Tensor | None]:
        lm, (ids,) = self.lm, prompts
        lm.reset(self.engine.cache_capacity(static=lm.static_eagerly), compile=self.engine.compile)
        hidden = torch.empty(0, len(layers) * lm.hidden_size, dtype=lm.dtype, device=lm.device) if layers else None
        if ids.shape[0] > 0:  # eager: the prompt's length varies from call to call
            _, hidden = lm.forward(ids, keep=1, hidden=layers, prompt=True)
        self._committed = lm.cache_length
        return [hidden]

    def verify(self, feeds: Sequence[Feed | None], layers: tuple[int, ...]) -> Verified:
        (feed,) = feeds
        assert feed is not None
        lm, engine = self.lm, self.engine
        n = feed.draft.shape[0]
        self._base = lm.cache_length
        ids = torch.cat([feed.committed[-1:], feed.draft])  # (n + 1,)
        self._tree = feed.tree
        if feed.tree:
            parents = feed.parents if feed.parents is not None else list(range(-1, n - 1))
            padded = None if feed.extra is None else feed.extra.padded(engine.extra_rows)  # one shape for every draft
            tree = lm.forward_tree(ids, parents, rows=engine.tree_rows(n), hidden=layers, extra=padded)
            extra = None if feed.extra is None or tree.extra is None else tree.extra[: feed.extra.tokens.shape[0]]
            return Verified([tree], None, [tree.states], [extra])
        # one shape per chain width (`Engine.chain_rows`: k + 1, and 2 under num_draft_tokens="auto"),
        # one for none
        rows = engine.chain_rows(n, bool(layers)) if lm.static else n + 1
        ids = torch.cat([ids, ids.new_zeros(rows - n - 1)])  # (rows,) the padding rows are rolled back unseen
        logits, states = lm.forward(ids, keep=rows, hidden=layers, rows=rows)  # (rows, V): one graph whatever n
        logits = logits[: n + 1]
        return Verified([TreeLogits(logits.new_empty(n + 1, 0), lm.lm_head, logits)], logits[None], [states], [None])

    def commit(self, paths: Sequence[Sequence[int] | None]) -> None:
        (path,) = paths
        assert path is not None
        if self._tree:
            self.lm.keep_path(self._base, list(path))
        else:  # a chain's path is its first rows
            self.lm.rollback(self._base + len(path))
        self._committed = self.lm.cache_length

    def select(self, slots: list[int]) -> None:
        if slots != [0]:
            raise ValueError(f"a generation of one prompt has slot 0 only, not {slots}")

    def cache_length(self, slot: int) -> int:
        return self.lm.cache_length

    def tampered(self) -> str | None:
        if self.lm.cache_length == self._committed:
            return None
        return f"changed the target's KV cache ({self._committed} -> {self.lm.cache_length} positions)"
