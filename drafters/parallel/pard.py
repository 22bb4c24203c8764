"""PARD: a draft model that drafts k tokens in one forward (An et al. 2025, "PARD: Accelerating LLM
Inference with Low-Cost PARallel Draft Model Adaptation", arXiv 2504.18583).

A PARD checkpoint is a plain causal LM trained to read a mask token ("pard token"): each step it
runs [the committed ids not yet in its cache, mask x (k - 1)] at consecutive positions, causally,
and the logits of the last k rows are q_1..q_k, the distributions of the k tokens after the last
committed one given the context alone (mask j stands in for the tokens between). Its cache then
keeps the committed ids only: the k - 1 mask entries are rolled back right after the forward,
and accepted drafts enter as committed ids at the next step, like the bonus token.

Exact under sampling: with sample=True (the default) and temperature > 0, d_j is drawn from its
own row, processed as the verifier processes p there (from the committed ids and d_1..d_{j-1}
when the settings read the prefix). q_j does not depend on the other draws, so it is exactly the
law d_j was drawn from given d_1..d_{j-1}, and reported as the draft's probs it keeps
`min(1, p/q)` exact. sample=False drafts each row's argmax (the reference's drafts, verified as
one-hot).

Everything else is the draft model's (`specdec.drafters.draft_models.draft_model`): loading, the
row form's cache and its rollback, drafting across tokenizers (TLI restricts each row to the shared
ids, SLEM re-tokenises the argmax chain's text) and the batched form's cache with holes, where
every row drafts in one forward. A compiled generation pads the committed ids to k + 1 rows and
always drafts the loop's k (cut to what is asked): one graph.

PARD-2 checkpoints (`pard2_*` config fields) add the target's hidden states to the input
embeddings; that target-dependent mode is not supported yet. `independent=True` runs them in
their target-independent mode (no features, as they were also trained), which is PARD-1's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import torch
from specdec.drafters.draft_models.draft_model import (
    GREEDY,
    DraftModelDrafter,
    DraftModelRow,
    translation_full,
)
from specdec.drafters.draft_models.draft_model_batch import DraftModelBatch
from specdec.drafters.draft_models.translation import Translation, same_vocabulary
from specdec.drafters.shared.batch_chains import (
    padded_visible,
    row_drafts,
    row_uniforms,
    shrink,
)
from specdec.drafters.shared.chains import chain_uniforms
from specdec.drafters.shared.forms import Forms
from transformers import PreTrainedModel

from specdec.protocols import Capability, DraftContext, Rows
from specdec.sampling import PrefixPicker, chain_sampling, pick
from specdec.types import Draft, Sampling

__all__ = ["PardDrafter", "check_pard2", "draft_block", "mask_token"]


def mask_token(model: PreTrainedModel, override: int | None, where: str) -> int:
    """The mask id: `override`, else the config's `pard_token`, else its `mask_token_id`; raises
    naming the model when there is none (the trainer's -1 included) or it has no embedding row."""
    token = override
    if token is None:
        named = (getattr(model.config, name, None) for name in ("pard_token", "mask_token_id"))
        token = next((found for found in named if found is not None and found != -1), None)
    if token is None:
        raise ValueError(f"pard: {where} names no mask token (its config has neither pard_token nor mask_token_id); "
                         "pass pard_token= with an id its tokenizer never produces")
    rows = int(model.get_input_embeddings().weight.shape[0])
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < rows:
        raise ValueError(f"pard: pard_token {token!r} of {where} is outside its vocabulary [0, {rows}); pass "
                         "pard_token= with an id of its embedding table")
    return token


def check_pard2(config: Any, where: str, independent: bool) -> None:
    """Refuse a PARD-2 checkpoint unless `independent`, naming the field that marks it."""
    fields = sorted(key for key in vars(config) if key == "pard2" or key.startswith("pard2_"))
    if getattr(config, "spd_type", None) == "pard2":
        fields.append("spd_type")
    if not fields:
        return
    if not independent:
        raise ValueError(f"pard: {where} is a PARD-2 checkpoint (its config sets {fields[0]}), whose target-dependent "
                         "mode adds the target's projected hidden states to its input embeddings; that mode is not "
                         "supported yet. Pass independent=true to draft without them (its target-independent mode, "
                         "which it was also trained for), or use a PARD-1 checkpoint")
    if getattr(config, "pard2_proj_bias", False):
        raise ValueError(f"pard: {where} sets pard2_proj_bias: without target features its projection still adds "
                         "a bias to every input embedding, which independent=true does not; it serves checkpoints "
                         "without the bias (the released ones)")


def draft_block(logits: torch.Tensor, sampling: Sampling | PrefixPicker, uniforms: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """d_1..d_n from the block's logits [n, V], row j picked from its own distribution (argmax, or a
    draw at uniforms[j]); a `PrefixPicker` processes row j after d_1..d_{j-1}. Returns tokens [n]
    and q [n, V] (None when greedy)."""
    n = logits.shape[0]
    if not isinstance(sampling, PrefixPicker):
        return pick(logits, sampling, None if uniforms is None else uniforms[:n])
    picked = [sampling(logits[j : j + 1], None if uniforms is None else uniforms[j : j + 1]) for j in range(n)]
    rows = [q for _, q in picked if q is not None]
    return torch.cat([token for token, _ in picked]), torch.cat(rows) if rows else None


def _where(model: PreTrainedModel | str | Path) -> str:
    """The model's name for messages: its path or hub id, else its class."""
    if isinstance(model, (str, Path)):
        return repr(str(model))
    return repr(getattr(model.config, "name_or_path", "") or type(model).__name__)


class PardDrafter(DraftModelDrafter):
    """Drafts with the PARD checkpoint `model` (a causal LM, a directory or a hub id).

    pard_token: the mask id (default: the config's `pard_token`, else its `mask_token_id`).
    sample, translate, tokenizer, shard: as for `draft-model`. independent: run a PARD-2
    checkpoint without target features. Chains only.

    A checkpoint may have one row more than the target, its mask's (`specdec train pard` adds it
    when the target's tokenizer uses every row): that row is never drafted.
    """

    name: ClassVar[str] = "pard"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.STATE, Capability.CACHE_LENGTH})
    tree_options: ClassVar[dict[str, Any] | None] = None  # chains only (no tree mode in the bench, demo or play)

    def __init__(self, model: PreTrainedModel | str | Path, pard_token: int | None = None, sample: bool = True,
                 translate: str = "auto", tokenizer: Any = None, shard: bool = False,
                 independent: bool = False) -> None:
        if not isinstance(independent, bool):
            raise TypeError(f"pard: independent must be true or false, got {independent!r}")
        super().__init__(model, shard=shard, sample=sample, translate=translate, tokenizer=tokenizer)
        where = _where(model)
        check_pard2(self.lm.model.config, where, independent)
        self.pard_token = mask_token(self.lm.model, pard_token, where)
        self._forms = Forms(lambda: PardRow(self), lambda: PardBatch(self))

    def _bridge(self, ctx: DraftContext) -> Translation | None:
        """The draft model's bridge, where a last row of its own (the mask's, past the target's ids)
        still counts as the target's vocabulary."""
        if self.lm.vocab_size == ctx.vocab_size + 1 and self.pard_token == ctx.vocab_size:
            target_tokenizer, draft_tokenizer = ctx.tokenizer, self.draft_tokenizer
            if target_tokenizer is None or draft_tokenizer is None or \
                    same_vocabulary(draft_tokenizer, target_tokenizer, ctx.vocab_size, ctx.vocab_size):
                return None
        return super()._bridge(ctx)


class PardRow(DraftModelRow):
    """One row's drafting on a cache of its own (the row form): prefill, commit and the cache are
    the draft model's; a draft is one forward."""

    def __init__(self, drafter: PardDrafter) -> None:
        super().__init__(drafter)
        self.mask = drafter.pard_token

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        ids = self._context_ids(ctx)  # (T',) the committed sequence in the draft model's ids
        self.committed = ids.shape[0]
        most = self.lm.max_positions
        if most is not None:  # a draft model with fewer positions drafts less
            k = min(k, most - self.committed)
        if translation_full(self, k):  # the draft model's ids outgrew their cache (`Translation.capacity`)
            k = 0
        if k <= 0 or self.committed == 0:
            return Draft(ctx.tokens[:0])
        # compiled: always the loop's k, one graph (a row's q depends on the masks before it only)
        whole = self.lm.compiled and k <= self._max_draft and (most is None or self.committed + self._max_draft <= most)
        depth = self._max_draft if whole else k
        logits = self._block(ids[self.lm.cache_length :], depth)  # (depth, V')
        translation = self.translation
        slem = translation is not None and translation.mode == "slem"
        if translation is not None:
            translation.held = ids.tolist()  # the cache holds the committed ids only
            if translation.vocab is not None:  # TLI: each row over the shared ids, in the target's vocabulary
                logits = translation.vocab.logits_to_target(logits)  # (depth, V)
        else:
            logits = logits[:, : ctx.vocab_size]  # a mask row past the target's ids is never drafted
        uniforms = chain_uniforms(ctx, depth, self.sample and not ctx.sampling.greedy and not slem)
        tokens, probs = draft_block(logits[:k], GREEDY if slem else chain_sampling(ctx), uniforms)
        if slem:  # the argmax chain's text in the target's ids, verified by sample-and-match
            assert translation is not None
            drafted = translation.target_ids(tokens.tolist(), ctx.tokens, k)
            return Draft(torch.tensor(drafted, dtype=torch.long, device=ctx.tokens.device), forwards=1)
        return Draft(tokens, probs, forwards=1)

    def _block(self, pending: torch.Tensor, depth: int) -> torch.Tensor:
        """Run pending [m] (the committed ids the cache lacks) and depth - 1 masks in one forward,
        padded to k + 1 + depth - 1 rows when m <= k + 1 (one graph); then roll the masks back.
        Returns the logits of the last pending id and of each mask (depth, V')."""
        base, count = self.lm.cache_length, pending.shape[0]
        fed = torch.cat([pending, pending.new_full((depth - 1,), self.mask)])  # (m + depth - 1,)
        rows = self._max_draft + depth if count <= self._max_draft + 1 else None
        logits, _ = self.lm.forward(fed, keep=depth, rows=rows)
        self.lm.rollback(base + count)  # the cache keeps real (committed) ids only
        return logits


class PardBatch(DraftModelBatch):
    """The batched form: every row drafts in one forward on the draft model's batch cache with
    holes. Each batch row feeds the committed ids it lacks, right-aligned in k + 1 columns (more,
    eagerly, when a row lacks more) after padding that sees only itself, then its depth - 1 masks
    at the next positions; it keeps the ids' columns and leaves the masks' as holes. A row's draws
    are its batch-1 draws (`row_uniforms`). Serves what the draft model's batched form serves."""

    def __init__(self, drafter: PardDrafter) -> None:
        super().__init__(drafter)
        self.mask = drafter.pard_token

    def propose(self, ctxs: Rows, k: Mapping[int, int]) -> dict[int, Draft]:
        assert self.lm is not None
        self.slots = shrink(self.lm, self.slots, sorted(ctxs), self.compile)
        first = ctxs[min(ctxs)]
        depth = first.engine.max_draft if self.compile else max(k.values())  # compiled: one graph, cut
        if depth <= 0:
            return row_drafts(dict(ctxs), [], self.slots, dict(k), first.tokens[None, :0], None)
        logits = self._block(ctxs, depth, first.engine.max_draft + 1)[..., : first.vocab_size]  # (B, depth, V)
        batch, _, vocab = logits.shape
        sampled = self.drafter.sample and not first.sampling.greedy
        uniforms = row_uniforms(dict(ctxs), self.slots, batch, depth, sampled, logits.device)  # (B, depth)
        tokens, probs = pick(logits.reshape(batch * depth, vocab), first.sampling,
                             None if uniforms is None else uniforms.reshape(-1))
        drafts = row_drafts(dict(ctxs), sorted(ctxs), self.slots, dict(k), tokens.view(batch, depth),
                            None if probs is None else probs.view(batch, depth, vocab))
        return {row: replace(draft, forwards=1) if draft.tokens.numel() else draft for row, draft in drafts.items()}

    def _block(self, ctxs: Rows, depth: int, least: int) -> torch.Tensor:
        """One forward of every batch row's block, its pending ids in at least `least` columns;
        returns each batch row's last `depth` rows' logits (B, depth, V')."""
        assert self.lm is not None
        lm = self.lm
        pending = {row: ctx.tokens[self.cached[row] :] for row, ctx in ctxs.items()}
        span = max(least, *(ids.shape[0] for ids in pending.values()))  # columns of the pending ids
        width = span + depth - 1
        device = next(iter(ctxs.values())).tokens.device
        ids = torch.zeros(lm.rows, width, dtype=torch.long, device=device)  # (B, R)
        positions = torch.zeros(lm.rows, width, dtype=torch.long)  # (B, R)
        counts = torch.zeros(lm.rows, dtype=torch.long)  # (B,) rows each batch row attends with
        for row, row_ids in pending.items():
            slot, count, start = self.slots[row], row_ids.shape[0], self.cached[row]
            ids[slot, span - count : span] = row_ids
            ids[slot, span:] = self.mask
            positions[slot] = (torch.arange(width) - (span - count) + start).clamp(min=start)
            counts[slot] = count + depth - 1
        real, visible = padded_visible(counts, width, device, right=True)  # (B, R), (B, R, R)
        logits, _ = lm.forward(ids, positions.to(device), visible, keep=depth, fixed=span == least)
        real[:, span:] = False  # the masks' columns become holes
        lm.columns.keep_new(real)
        for row, row_ids in pending.items():
            self.cached[row] += row_ids.shape[0]
        return logits
