"""The (token, target feature) pairs that feature-level drafters (EAGLE, MTP) feed their caches.

Position j pairs the embedding of x_{j+1} with the target's hidden state f_j. A drafter's cache
holds the real pairs of positions 0..cached-1; the committed ids give pairs up to T-2, and the
missing ones' features are the last rows of `ctx.hidden_states`.
"""

from __future__ import annotations

import torch
from torch import nn

from typing import Any

from specdec.drafters.shared.chains import chain_uniforms
from specdec.protocols import DraftContext

__all__ = ["PREFILL_HOLD", "chain_inputs", "feed_pending", "pending_pairs", "pending_rows"]


def pending_pairs(ctx: DraftContext, cached: int, drafter: str, embed: nn.Module | None = None, hold: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Embeddings [P, H], features [P, F] and positions [P] of the real pairs not yet cached,
    but the last `hold` of them; `embed` is the drafter's own embedding (default: the target's).

    None when no such pair is left. Raises when the loop passed fewer hidden-state rows than
    pairs are missing (a drafter that does not declare `Capability.HIDDEN_STATES`).
    """
    start, end = cached, ctx.tokens.shape[0] - 1  # positions j in [start, end)
    if end - hold <= start:
        return None
    states = ctx.hidden_states
    if states is None or states.shape[0] < end - start:
        rows = None if states is None else states.shape[0]
        raise RuntimeError(f"{drafter}: {end - start} target hidden states needed, got {rows}; the loop "
                           "must pass the hidden states of every processed position")
    features = states[states.shape[0] - (end - start) : states.shape[0] - hold]  # (P, H) f_start .. f_{end-hold-1}
    end -= hold
    embeds = (ctx.target.embed_tokens if embed is None else embed)(ctx.tokens[start + 1 : end + 1])  # (P, H)
    return embeds, features, torch.arange(start, end, device=features.device)


PREFILL_HOLD = 1
"""Pairs a feature-level head's prefill leaves pending: the prompt's last pair is fed by the first
draft's catch-up-and-draft step (`HeadSteps.fed_chain`), the step every later draft runs, so that a
compiled generation builds one graph for the head's usual draft and not a second one (a draft loop
without a catch-up) for its first draft alone."""


def pending_rows(pending: int, max_draft: int) -> int | None:
    """The fixed number of rows a forward of `pending` pairs is padded to: the loop's k + 1,
    whether one pair is pending (after a rejection) or k + 1 (after a verify accepted the whole
    draft), so that a head's catch-up, alone or with its draft loop, is one graph and not two (the
    padding's cost is measured in docs/engine.md, "Fixed shapes"); None (unpadded, eager) for
    more than that."""
    return max_draft + 1 if pending <= max_draft + 1 else None


def feed_pending(steps: Any, ctx: DraftContext, drafter: str, eager: bool = False, embed: nn.Module | None = None,
                 hold: int = 0) -> torch.Tensor | None:
    """Run the real pairs not yet cached, but the last `hold` (`PREFILL_HOLD` in a prefill),
    through a head's fixed-shape steps (`specdec.drafters.feature_heads.head_steps.HeadSteps`: padded to
    `pending_rows`, or eagerly and unpadded when `eager`, as in a prefill); return the head's
    output at the last of them [1, H], or None when no pair was fed."""
    pairs = pending_pairs(ctx, steps.length, drafter, embed, hold)
    if pairs is None:
        return None
    rows = None if eager else pending_rows(pairs[0].shape[0], ctx.engine.max_draft)
    return steps(rows, *pairs)[-1:]  # (1, H)


def chain_inputs(ctx: DraftContext, k: int, sampled: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chain draft's positions of the fed-back pairs (d_i, f̂) [k - 1], at T - 1, T, ..., and
    its draws' uniforms (`specdec.drafters.shared.chains.chain_uniforms`; None when `sampled` is false)."""
    positions = torch.arange(k - 1, device=ctx.tokens.device) + ctx.tokens.shape[0] - 1
    return positions, chain_uniforms(ctx, k, sampled)
