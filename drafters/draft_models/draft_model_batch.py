"""The draft model's batched form (`specdec.drafters.shared.forms`): every
live row of a batch drafts with one forward of the draft model per depth, on its own batch cache
with holes (`specdec.runtime.batch_target.BatchLM`, as the target decodes a batch).

A step first feeds every row the committed ids its cache lacks (one after a rejection, up to
k + 1 after a full acceptance: ragged), padded to k + 1 rows per batch row with the padding
FIRST, so that every row's last real id sits in the last row and one row of logits per batch row
is computed; the padding sees only itself and no row keeps it. Then k - 1 forwards of one row
per batch row feed each drafted token back at the row's own position T + i. Those draft entries
are seen by the row's later draft steps and given back after the draft: the accepted ones return
with the next catch-up, which has room for them in its k + 1 rows, so the cache keeps the
committed ids only. Draws use each row's own generator and the uniforms batch-1 drafting draws
(`chain_uniforms`), so a row's draft is its batch-1 draft up to a batched forward's rounding.

Served natively: chains on the target's vocabulary under settings that read no prefix. Trees,
drafting across vocabularies, prefix-reading settings and draft models that cannot decode a
batch draft row by row (`serves` is false).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from specdec.drafters.shared.batch_chains import draft_chains, padded_visible, row_drafts, row_uniforms, shrink
from specdec.protocols import DraftContext, Rows
from specdec.runtime.batch_target import BatchLM
from specdec.runtime.cache import has_recurrent_state, new_cache
from specdec.types import Draft

__all__ = ["DraftModelBatch"]

HOLE_ROOM = 128  # cache columns beyond the generation and a step's draft rows, for holes before a compaction


class DraftModelBatch:
    """The batched form of a `DraftModelDrafter`."""

    def __init__(self, drafter: Any) -> None:
        self.drafter = drafter
        self.lm: BatchLM | None = None
        self.slots: dict[int, int] = {}  # row -> its batch row in the draft model's cache
        self.cached: dict[int, int] = {}  # row -> committed ids its cache holds
        self.compile = False

    def serves(self, ctx: DraftContext) -> bool:
        """Chains on the target's ids under settings that read no prefix, on a draft model that
        can decode a batch and has positions for the whole generation."""
        drafter = self.drafter
        if drafter.tree is not None or ctx.sampling.reads_prefix or not ctx.engine.max_length:
            return False
        if drafter.setup(ctx) is not None or drafter.lm.static_obstacle is not None or \
                has_recurrent_state(new_cache(drafter.lm.model)):  # a recurrent state gives no draft entry back
            return False
        most = drafter.lm.max_positions
        return most is None or most >= ctx.engine.max_length + ctx.engine.max_draft + 1

    def prefill(self, ctxs: Rows) -> None:
        first = ctxs[min(ctxs)]
        engine = first.engine
        rows = sorted(ctxs)
        self.compile = engine.compile
        self.lm = BatchLM(self.drafter.lm, len(rows), engine.capacity(2 * engine.max_draft + HOLE_ROOM),
                          compile=engine.compile)
        self.slots = {row: slot for slot, row in enumerate(rows)}
        self.lm.prefill([ctxs[row].tokens[:-1] for row in rows])
        self.cached = {row: max(ctxs[row].tokens.shape[0] - 1, 0) for row in rows}

    def propose(self, ctxs: Rows, k: Mapping[int, int]) -> dict[int, Draft]:
        assert self.lm is not None
        lm = self.lm
        self.slots = shrink(lm, self.slots, sorted(ctxs), self.compile)
        first = ctxs[min(ctxs)]
        sampling, device = first.sampling, first.tokens.device
        n = first.engine.max_draft if self.compile else max(k.values())  # compiled: the usual chain, cut (one graph)
        if n <= 0:
            return row_drafts(ctxs, [], self.slots, k, first.tokens[None, :0], None)
        logits, ends = self._feed(ctxs, first.engine.max_draft + 1)  # (B, V), (B,) each row's T
        sampled = self.drafter.sample and not sampling.greedy
        uniforms = row_uniforms(ctxs, self.slots, lm.rows, n, sampled, device)
        alone = torch.ones(lm.rows, 1, 1, dtype=torch.bool, device=device)  # (B, 1, 1)

        def advance(i: int, token: torch.Tensor) -> torch.Tensor:
            return lm.forward(token[:, None], (ends + i)[:, None], alone)[0][:, -1]  # (B, V)

        chain, probs = draft_chains(lm, logits, advance, sampling, uniforms, n)
        return row_drafts(ctxs, sorted(ctxs), self.slots, k, chain, probs)

    def commit(self, ctxs: Rows, accepted: Mapping[int, int]) -> None:
        """Nothing to roll back: the draft entries were given back in `propose`, and each row feeds
        the committed ids its cache lacks at the next one."""

    def cache_length(self, row: int) -> int:
        """The committed ids row `row`'s cache holds."""
        return self.cached.get(row, 0)

    def _feed(self, ctxs: Rows, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed each row the committed ids its cache lacks, right-aligned in `rows` rows (more,
        eagerly, when a row lacks more); returns the logits at each batch row's last id (B, V)
        and each batch row's committed length T (B,) on the device."""
        assert self.lm is not None
        lm = self.lm
        pending = {row: ctx.tokens[self.cached[row] :] for row, ctx in ctxs.items()}
        longest = max(ids.shape[0] for ids in pending.values())
        width = max(rows, longest)
        device = next(iter(ctxs.values())).tokens.device
        ids = torch.zeros(lm.rows, width, dtype=torch.long, device=device)  # (B, R)
        positions = torch.zeros(lm.rows, width, dtype=torch.long)  # (B, R)
        counts = torch.zeros(lm.rows, dtype=torch.long)  # (B,) real ids per batch row
        ends = torch.ones(lm.rows, dtype=torch.long)  # (B,)
        for row, row_ids in pending.items():
            slot, count, start = self.slots[row], row_ids.shape[0], self.cached[row]
            ids[slot, width - count :] = row_ids
            positions[slot] = (torch.arange(width) - (width - count) + start).clamp(min=start)
            counts[slot], ends[slot] = count, start + count
        real, visible = padded_visible(counts, width, device, right=True)  # (B, R), (B, R, R)
        out, _ = lm.forward(ids, positions.to(device), visible, keep=1, fixed=width == rows)
        lm.columns.keep_new(real)
        for row, row_ids in pending.items():
            self.cached[row] += row_ids.shape[0]
        return out[:, -1], ends.to(device)
