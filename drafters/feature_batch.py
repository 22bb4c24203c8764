"""The batched form of the feature-level drafters (EAGLE, EAGLE-3, MTP; `batch_form`, see
`specdec.decoding.batch_drafters`): every live row of a batch drafts in one forward per depth.

A step first catches every row up on its real pairs (x_{j+1}, f_j) not yet cached (one after a
rejection, up to k + 1 after a full acceptance: ragged), padded to k + 1 rows per batch row, the
padding seeing only itself and kept by no row; each row's output at its last real pair starts
its chain. Then k - 1 forwards of one row per batch row feed each drafted token back with the
head's output, at the row's own position T - 1 + i; those draft entries are seen by the row's
later draft steps and given back after the draft, so the head's cache keeps one entry per real
pair, as batch-1 drafting's rollback leaves it (`specdec.drafters.eagle`). Draws use the row's
own generator and the uniforms batch-1 drafting would draw (`chain_uniforms`), so a row's draft
is its batch-1 draft up to the rounding of a batched forward.

Served natively: chains, greedy or sampled, under settings that do not read the prefix. Trees,
and settings that process each row from its own history, draft row by row (`serves` is false).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from specdec.drafters.batch_chains import draft_chains, padded_visible, row_drafts, row_uniforms, shrink
from specdec.drafters.feature_pairs import PREFILL_HOLD, pending_pairs
from specdec.drafters.head_batch import BatchHead, HeadForward
from specdec.protocols import DraftContext
from specdec.types import Draft

__all__ = ["FeatureBatch", "FeatureParts", "HOLE_ROOM", "pair_forward"]

HOLE_ROOM = 128  # head cache columns beyond the generation and a step's draft rows, for holes before a compaction


@dataclass(frozen=True)
class FeatureParts:
    """What the batched form needs of one feature-level drafter in one generation."""

    drafter: str  # its registry name, for errors
    head: nn.Module
    name: str  # the head's, for compile diagnostics
    forward: HeadForward
    embed: nn.Module  # token ids -> embeddings [.., H]
    logits: nn.Module  # LM-head inputs [n, H] -> logits [n, V] over the target's vocabulary
    stages: int = 1  # the head's stages (MTP): depth d runs stage min(d, stages - 1)


def pair_forward(head: nn.Module, cache: Any, mask: torch.Tensor, stage: int, embeds: torch.Tensor,
                 features: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An EAGLE or EAGLE-3 head's batched forward: its output is both what feeds back and what
    the LM head reads."""
    out = head(embeds, features, positions, cache, mask)  # (B, R, H)
    return out, out


class FeatureBatch:
    """The batched form of `drafter`, which defines `batch_parts(ctx) -> FeatureParts` (checking
    that its head fits the target and moving it there) and has `tree` and `sample` settings."""

    def __init__(self, drafter: Any, rows: int) -> None:
        self.drafter, self.rows = drafter, rows
        self.parts: FeatureParts | None = None
        self.head: BatchHead | None = None
        self.slots: dict[int, int] = {}  # row -> its batch row in the head's cache
        self.cached: dict[int, int] = {}  # row -> real pairs its cache holds
        self.compile = False

    def serves(self, ctx: DraftContext) -> bool:
        """Chains under settings that read no prefix (the others draft row by row)."""
        return self.drafter.tree is None and not ctx.sampling.reads_prefix and bool(ctx.engine.max_length)

    def prefill_batch(self, ctxs: dict[int, DraftContext]) -> None:
        first = ctxs[min(ctxs)]
        parts = self.parts = self.drafter.batch_parts(first)
        engine = first.engine
        k = engine.max_draft
        self.compile = engine.compile
        rows = sorted(ctxs)
        self.head = BatchHead(parts.head, parts.forward, parts.name, len(rows),
                              engine.capacity(2 * k + HOLE_ROOM), engine.compile)
        self.slots = {row: slot for slot, row in enumerate(rows)}
        self.cached = dict.fromkeys(rows, 0)
        self._feed(ctxs, PREFILL_HOLD, None)  # the last pair waits for the first draft

    def propose_batch(self, ctxs: dict[int, DraftContext], k: dict[int, int]) -> dict[int, Draft]:
        assert self.parts is not None and self.head is not None
        head, parts = self.head, self.parts
        self.slots = shrink(head, self.slots, sorted(ctxs), self.compile)
        first = ctxs[min(ctxs)]
        sampling, n, device = first.sampling, max(k.values()), first.tokens.device
        fed = self._feed(ctxs, 0, first.engine.max_draft + 1)
        if fed is None or n <= 0:
            return row_drafts(ctxs, [], self.slots, k, first.tokens[None, :0], None)
        feature, logit_input, ready = fed  # (B, H), (B, H), rows with a chain
        sampled = self.drafter.sample and not sampling.greedy
        uniforms = row_uniforms({row: ctxs[row] for row in ready}, self.slots, head.rows, n, sampled, device)
        start = torch.zeros(head.rows, dtype=torch.long)  # (B,) each row's first draft position, T - 1
        start[[self.slots[row] for row in ready]] = torch.tensor([ctxs[row].tokens.shape[0] - 1 for row in ready])
        start = start.to(device)
        alone = torch.ones(head.rows, 1, 1, dtype=torch.bool, device=device)  # (B, 1, 1)
        state = [feature]

        def advance(i: int, token: torch.Tensor) -> torch.Tensor:
            fed_back, logit_in = head(min(i + 1, parts.stages - 1), parts.embed(token)[:, None], state[0][:, None],
                                      (start + i)[:, None], alone)  # (B, 1, H) each
            state[0] = fed_back[:, 0]
            return parts.logits(logit_in[:, 0])  # (B, V)

        chain, probs = draft_chains(head, parts.logits(logit_input), advance, sampling, uniforms, n)
        return row_drafts(ctxs, ready, self.slots, k, chain, probs)

    def _feed(self, ctxs: dict[int, DraftContext], hold: int, rows: int | None
              ) -> tuple[torch.Tensor, torch.Tensor, list[int]] | None:
        """Feed each row's real pairs not yet cached, but the last `hold`, padded to `rows` per
        batch row (None: to the most any row has, eagerly, as in a prefill); the rows keep theirs.
        Returns the head's outputs at each batch row's last fed pair (B, H) each, and the rows fed."""
        assert self.parts is not None and self.head is not None
        parts, head = self.parts, self.head
        pending = {}
        for row, ctx in ctxs.items():
            pairs = pending_pairs(ctx, self.cached[row], parts.drafter, parts.embed, hold)
            if pairs is not None:
                pending[row] = pairs
        if not pending:
            return None
        longest = max(pairs[0].shape[0] for pairs in pending.values())
        fixed = rows is not None and longest <= rows
        width = rows if fixed and rows is not None else longest
        embeds, features, positions = next(iter(pending.values()))
        batch = head.rows
        device = embeds.device
        embeds_in = embeds.new_zeros(batch, width, embeds.shape[-1])  # (B, R, H)
        features_in = features.new_zeros(batch, width, features.shape[-1])  # (B, R, F)
        positions_in = torch.zeros(batch, width, dtype=torch.long, device=device)  # (B, R)
        counts = torch.zeros(batch, dtype=torch.long)  # (B,) real pairs per batch row
        for row, (row_embeds, row_features, row_positions) in pending.items():
            slot, count = self.slots[row], row_embeds.shape[0]
            embeds_in[slot, :count] = row_embeds
            features_in[slot, :count] = row_features
            positions_in[slot, :count] = row_positions
            positions_in[slot, count:] = row_positions[-1]  # the padding: a valid position, seen by nothing
            counts[slot] = count
        counts_d = counts.to(device)
        _, visible = padded_visible(counts, width, device)  # (B, R, R)
        feature, logit_input = head(0, embeds_in, features_in, positions_in, visible, fixed=fixed)
        kept = [(slot, c) for slot in range(batch) for c in range(int(counts[slot]))]
        head.keep([slot for slot, _ in kept], [c for _, c in kept])
        for row, pairs in pending.items():
            self.cached[row] += pairs[0].shape[0]
        last = (counts_d - 1).clamp(min=0)[:, None, None].expand(batch, 1, feature.shape[-1])  # (B, 1, H)
        return feature.gather(1, last)[:, 0], logit_input.gather(1, last)[:, 0], sorted(pending)
