"""The batched form of the feature-level drafters (EAGLE, EAGLE-3, MTP; `specdec.drafters.shared.forms`):
every live row of a batch drafts in one forward per depth.

A step first catches every row up on its real pairs (x_{j+1}, f_j) not yet cached (one after a
rejection, up to k + 1 after a full acceptance: ragged), padded to k + 1 rows per batch row, the
padding seeing only itself and kept by no row; each row's output at its last real pair starts
its chain. Then k - 1 forwards of one row per batch row feed each drafted token back with the
head's output, at the row's own position T - 1 + i; those draft entries are seen by the row's
later draft steps and given back after the draft, so the head's cache keeps one entry per real
pair, as batch-1 drafting's rollback leaves it (`specdec.drafters.feature_heads.eagle`). Draws use the row's
own generator and the uniforms batch-1 drafting would draw (`chain_uniforms`), so a row's draft
is its batch-1 draft up to the rounding of a batched forward.

The catch-up and the chain run as one step (`fed_chains`: one compiled graph per batch shape when
the generation compiles), the chain's masks made inside it from the rows' kept columns. A greedy
top-k tree (EAGLE-2, `specdec.drafters.tree_search.graph.topk_trees`) follows the catch-up with one
forward of top_k rows per batch row and expanded depth.

Served natively: chains, greedy or sampled, and top-k trees, under settings that do not read the
prefix. Sampled trees, and settings that process each row from its own history, draft row by
row (`serves` is false).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from specdec.drafters.shared.batch_chains import padded_visible, row_drafts, row_uniforms, shrink
from specdec.drafters.feature_heads.feature_pairs import PREFILL_HOLD, pending_pairs
from specdec.drafters.feature_heads.head_batch import BatchHead, HeadForward
from specdec.drafters.tree_search.dynamic import SampledGrowth, prefix_q
from specdec.drafters.tree_search.graph import expansions, topk_trees, tree_depth
from specdec.protocols import DraftContext, Rows
from specdec.sampling import PrefixPicker, RowsPicker, pick
from specdec.trees import depths
from specdec.types import Draft, Sampling

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


def fed_chains(head: nn.Module, cache: Any, forward: HeadForward, mask: torch.Tensor, embeds: torch.Tensor,
               features: torch.Tensor, positions: torch.Tensor, last: torch.Tensor, valid: torch.Tensor,
               first: torch.Tensor, start: torch.Tensor, logits: nn.Module, embed: nn.Module,
               uniforms: torch.Tensor | None, sampling: Sampling, stages: int, n: int
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The catch-up of every batch row (embeds [B, R, H], features [B, R, F], positions [B, R],
    under `mask` [B, 1, R, C]) and each row's chain of n tokens from its output at its last real
    pair (last [B]): each token by `pick` (argmax, or a draw at uniforms[:, i]), each fed back
    at position start + i ([B]) in column first + i (0-d), seeing the row's kept columns (valid
    [B, C], the catch-up's included) and its chain's earlier entries. Returns tokens [B, n] and
    q [B, n, V] (None when greedy)."""
    fed_back, logit_in = forward(head, cache, mask, 0, embeds, features, positions)  # (B, R, H) each
    index = last[:, None, None].expand(-1, 1, fed_back.shape[-1])  # (B, 1, H)
    feature, logit_input = fed_back.gather(1, index)[:, 0], logit_in.gather(1, index)[:, 0]  # (B, H) each
    columns = torch.arange(valid.shape[1], device=valid.device)  # (C,)
    low = torch.finfo(mask.dtype).min
    tokens: list[torch.Tensor] = []
    probs: list[torch.Tensor] = []
    for i in range(n):
        token, q = pick(logits(logit_input), sampling, None if uniforms is None else uniforms[:, i])  # (B,), (B, V)
        tokens.append(token)
        if q is not None:
            probs.append(q)
        if i + 1 < n:
            seen = valid | ((columns >= first) & (columns <= first + i))[None]  # (B, C)
            step_mask = torch.zeros(seen.shape, dtype=mask.dtype, device=seen.device).masked_fill(~seen, low)
            fed, lin = forward(head, cache, step_mask[:, None, None], min(i + 1, stages - 1), embed(token)[:, None],
                               feature[:, None], (start + i)[:, None])  # (B, 1, H) each
            feature, logit_input = fed[:, 0], lin[:, 0]
    return torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None


def pair_forward(head: nn.Module, cache: Any, mask: torch.Tensor, stage: int, embeds: torch.Tensor,
                 features: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An EAGLE or EAGLE-3 head's batched forward: its output is both what feeds back and what
    the LM head reads."""
    out = head(embeds, features, positions, cache, mask)  # (B, R, H)
    return out, out


class FeatureBatch:
    """The batched form of `drafter`, which defines `batch_parts(ctx) -> FeatureParts` (checking
    that its head fits the target and moving it there) and has `tree` and `sample` settings."""

    def __init__(self, drafter: Any) -> None:
        self.drafter = drafter
        self.parts: FeatureParts | None = None
        self.head: BatchHead | None = None
        self.slots: dict[int, int] = {}  # row -> its batch row in the head's cache
        self.cached: dict[int, int] = {}  # row -> real pairs its cache holds
        self.compile = False

    def serves(self, ctx: DraftContext) -> bool:
        """Every setting: chains (each row from its own prefix when the settings read it), top-k
        trees and trees of sampled siblings."""
        return bool(ctx.engine.max_length)

    def prefill(self, ctxs: Rows) -> None:
        first = ctxs[min(ctxs)]
        parts = self.parts = self.drafter.batch_parts(first)
        engine = first.engine
        k = engine.max_draft
        tree = self.drafter.tree
        self.compile = engine.compile
        rows = sorted(ctxs)
        draft_rows = k - 1 if tree is None else expansions(tree, tree_depth(tree, k))
        self.head = BatchHead(parts.head, parts.forward, parts.name, len(rows),
                              engine.capacity(k + 1 + draft_rows + HOLE_ROOM), engine.compile)
        self.slots = {row: slot for slot, row in enumerate(rows)}
        self.cached = dict.fromkeys(rows, 0)
        pending = self._pending(ctxs, PREFILL_HOLD, None)  # the last pair waits for the first draft
        if pending is not None:
            embeds, features, positions, counts, _, fixed = pending
            real, visible = padded_visible(counts, positions.shape[1], positions.device)
            self.head(0, embeds, features, positions, visible, fixed=fixed)
            self.head.columns.keep_new(real)

    def propose(self, ctxs: Rows, k: Mapping[int, int]) -> dict[int, Draft]:
        assert self.parts is not None and self.head is not None
        head, parts = self.head, self.parts
        self.slots = shrink(head, self.slots, sorted(ctxs), self.compile)
        first = ctxs[min(ctxs)]
        sampling, device = first.sampling, first.tokens.device
        n = first.engine.max_draft if self.compile else max(k.values())  # compiled: the usual chain, cut (one graph)
        pending = self._pending(ctxs, 0, first.engine.max_draft + 1)
        if pending is None or n <= 0:
            return row_drafts(ctxs, [], self.slots, k, first.tokens[None, :0], None)
        embeds, features, positions, counts, ready, fixed = pending
        rows = positions.shape[1]
        ends = torch.zeros(head.rows, dtype=torch.long)  # (B,) each row's committed length T
        ends[[self.slots[row] for row in ready]] = torch.tensor([ctxs[row].tokens.shape[0] for row in ready])
        ends = ends.to(device)
        last = (counts - 1).clamp(min=0).to(device)  # (B,) each batch row's last real pair
        sampled = self.drafter.sample and not sampling.greedy
        if self.drafter.tree is not None:
            trees = self._sampled_trees if sampled else self._trees
            return trees(ctxs, k, ready, pending, ends, last)
        uniforms = row_uniforms({row: ctxs[row] for row in ready}, self.slots, head.rows, n, sampled, device)
        picker: Sampling | RowsPicker = sampling
        if sampling.reads_prefix:  # each row draws from its own prefix, on the host: the chain runs eagerly
            picker, fixed = RowsPicker({self.slots[row]: PrefixPicker(ctxs[row]) for row in ready}), False
        head.begin(rows + n - 1)
        real, visible = padded_visible(counts, rows, device)
        mask = head.mask(visible)  # (B, 1, R, C)
        head.columns.keep_new(real)
        first_column = torch.tensor(head.base + rows).to(device, non_blocking=True)  # 0-d: the chain's first column
        chain, probs = head.run(fed_chains, rows + n - 1, fixed, parts.forward, mask, embeds, features, positions,
                                last, head.valid, first_column, ends - 1, parts.logits, parts.embed, uniforms,
                                picker, parts.stages, n)
        return row_drafts(ctxs, ready, self.slots, k, chain, probs)

    def commit(self, ctxs: Rows, accepted: Mapping[int, int]) -> None:
        """Nothing to roll back: the draft entries were given back in `propose`, and the accepted
        positions come back as real pairs with the next catch-up."""

    def cache_length(self, row: int) -> int:
        """The real pairs row `row`'s cache holds."""
        return self.cached.get(row, 0)

    def _catch_up(self, pending: tuple[Any, ...], last: torch.Tensor, after: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed every row's pending pairs (the draft's `after` columns follow them) and return the
        head's outputs at each batch row's last real pair: (fed back, LM-head input), [B, H] each."""
        assert self.head is not None
        head = self.head
        embeds, features, positions, counts, _, fixed = pending
        rows = positions.shape[1]
        head.begin(rows + after)  # the draft's columns follow the catch-up's
        real, visible = padded_visible(counts, rows, positions.device)
        fed_back, logit_in = head(0, embeds, features, positions, visible, fixed=fixed)  # (B, R, H) each
        head.columns.keep_new(real)
        index = last[:, None, None].expand(-1, 1, fed_back.shape[-1])
        return fed_back.gather(1, index)[:, 0], logit_in.gather(1, index)[:, 0]  # (B, H) each

    def _trees(self, ctxs: Rows, k: Mapping[int, int], ready: list[int], pending: tuple[Any, ...],
               ends: torch.Tensor, last: torch.Tensor) -> dict[int, Draft]:
        """Every ready row's EAGLE-2 top-k tree (`topk_trees`) after the catch-up; a row whose
        budget allows a shallower tree keeps the nodes within its depth."""
        assert self.parts is not None and self.head is not None and self.drafter.tree is not None
        head, parts, tree = self.head, self.parts, self.drafter.tree
        depth = tree_depth(tree, max(k.values()))
        root, root_input = self._catch_up(pending, last, expansions(tree, depth))

        def expand(e: int, tokens: torch.Tensor, states: tuple[torch.Tensor, ...], positions: torch.Tensor,
                   mask: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
            out, out_input = head.run(parts.forward, tokens.shape[1], True, mask, min(e, parts.stages - 1),
                                      parts.embed(tokens), states[0], positions)  # (B, K, H) each
            return (out,), parts.logits(out_input.reshape(-1, out_input.shape[-1])).reshape(*tokens.shape, -1)

        valid = head.valid
        tokens, parents = topk_trees(expand, parts.logits(root_input), (root,), lambda e: valid, head.columns.width,
                                     ends - 2, tree, depth)  # (B, n) each; expansion 1 writes after the catch-up
        parents_host = parents.tolist()
        drafts = row_drafts(ctxs, [], self.slots, k, tokens, None)
        for row in ready:
            slot, allowed = self.slots[row], tree_depth(tree, k[row])
            if allowed <= 0:
                continue
            count = sum(1 for d in depths(parents_host[slot]) if d <= allowed)  # kept nodes come depth by depth
            drafts[row] = Draft(tokens[slot, :count], None, tokens.new_tensor(parents_host[slot][:count]))
        return drafts

    def _sampled_trees(self, ctxs: Rows, k: Mapping[int, int], ready: list[int], pending: tuple[Any, ...],
                       ends: torch.Tensor, last: torch.Tensor) -> dict[int, Draft]:
        """Every ready row's tree of sampled siblings (`SampledGrowth`, temperature > 0), the rows in
        lockstep: after the catch-up, one forward of top_k rows per batch row and depth runs each
        row's chosen nodes as pairs (their tokens, their parents' outputs) at position T - 2 + depth,
        each seeing its row's kept columns, its ancestors' columns and itself."""
        assert self.parts is not None and self.head is not None and self.drafter.tree is not None
        head, parts, tree = self.head, self.parts, self.drafter.tree
        levels = max(min(k[row], tree.depth or k[row]) for row in ready)
        width = tree.top_k  # rows per batch row and depth
        root, root_input = self._catch_up(pending, last, max(levels - 1, 0) * width)
        root_logits = parts.logits(root_input)  # (B, V)
        growths = {row: SampledGrowth(root_logits[self.slots[row]], tree, k[row], ctxs[row].sampling,
                                      ctxs[row].generator, prefix_q(ctxs[row])) for row in ready}
        outputs: dict[tuple[int, int], torch.Tensor] = {}  # (row, node) -> its fed-back output [H]
        columns: dict[tuple[int, int], int] = {}  # (row, node) -> the head column it was run at
        device, batch = root.device, head.rows
        while True:
            asked = {row: nodes for row, growth in growths.items() if (nodes := growth.next()) is not None}
            if not asked:
                break
            head.begin(width)
            tokens = torch.zeros(batch, width, dtype=torch.long, device=device)  # (B, K)
            features = root.new_zeros(batch, width, root.shape[-1])  # (B, K, H)
            positions = torch.zeros(batch, width, dtype=torch.long)  # (B, K)
            seen = head.columns.seen(torch.eye(width, dtype=torch.bool, device=device).expand(batch, -1, -1))
            seen = seen.cpu()  # (B, K, C): set on the host, node by node
            stage = 0
            for row, nodes in asked.items():
                slot, search = self.slots[row], growths[row].search
                stage = min(search.depths[nodes[0]], parts.stages - 1)
                for i, node in enumerate(nodes):
                    parent = search.parents[node]
                    tokens[slot, i] = search.tokens[node]
                    features[slot, i] = outputs[row, parent] if parent >= 0 else root[slot]
                    positions[slot, i] = ctxs[row].tokens.shape[0] - 2 + search.depths[node]
                    while parent >= 0:
                        seen[slot, i, columns[row, parent]] = True
                        parent = search.parents[parent]
                    columns[row, node] = head.base + i
            mask = torch.zeros(seen.shape, dtype=head.dtype).masked_fill_(~seen, torch.finfo(head.dtype).min)
            out, out_input = head.run(parts.forward, width, True, mask.to(device)[:, None], stage,
                                      parts.embed(tokens), features, positions.to(device))  # (B, K, H) each
            logits = parts.logits(out_input.reshape(-1, out_input.shape[-1])).reshape(batch, width, -1)  # (B, K, V)
            for row, nodes in asked.items():
                slot = self.slots[row]
                outputs.update({(row, node): out[slot, i] for i, node in enumerate(nodes)})
                growths[row].take(logits[slot, : len(nodes)])
        drafts = row_drafts(ctxs, [], self.slots, k, root.new_zeros(batch, 0, dtype=torch.long), None)
        drafts.update({row: growth.draft(device) for row, growth in growths.items()})
        return drafts

    def _pending(self, ctxs: dict[int, DraftContext], hold: int, rows: int | None) -> tuple[Any, ...] | None:
        """Each row's real pairs not yet cached, but the last `hold`, padded to `rows` per batch
        row (None: to the most any row has, as in a prefill): embeddings [B, R, H], features
        [B, R, F], positions [B, R], counts [B] (host), the rows with pairs, and whether the shape
        is the usual one. None when no row has any."""
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
        embeds, features, _ = next(iter(pending.values()))
        batch, device = head.rows, embeds.device
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
            self.cached[row] += count
        return embeds_in, features_in, positions_in, counts, sorted(pending), fixed
