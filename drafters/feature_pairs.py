"""The (token, target feature) pairs that feature-level drafters (EAGLE, MTP) feed their caches.

Position j pairs the embedding of x_{j+1} with the target's hidden state f_j. A drafter's cache
holds the real pairs of positions 0..cached-1; the committed ids give pairs up to T-2, and the
missing ones' features are the last rows of `ctx.hidden_states`.
"""

from __future__ import annotations

import torch
from torch import nn

from typing import Any

from specdec.protocols import DraftContext

__all__ = ["chain_inputs", "feed_pending", "pending_pairs", "pending_rows"]


def pending_pairs(ctx: DraftContext, cached: int, drafter: str, embed: nn.Module | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Embeddings [P, H], features [P, F] and positions [P] of the real pairs not yet cached;
    `embed` is the drafter's own embedding (default: the target's).

    None when every pair is cached. Raises when the loop passed fewer hidden-state rows than
    pairs are missing (a drafter without `uses_hidden_states = True`).
    """
    start, end = cached, ctx.tokens.shape[0] - 1  # positions j in [start, end)
    if end <= start:
        return None
    states = ctx.hidden_states
    if states is None or states.shape[0] < end - start:
        rows = None if states is None else states.shape[0]
        raise RuntimeError(f"{drafter}: {end - start} target hidden states needed, got {rows}; the loop "
                           "must pass uses_hidden_states rows for every processed position")
    features = states[states.shape[0] - (end - start) :]  # (P, H) f_start .. f_{end-1}
    embeds = (ctx.target.embed_tokens if embed is None else embed)(ctx.tokens[start + 1 : end + 1])  # (P, H)
    return embeds, features, torch.arange(start, end, device=features.device)


def pending_rows(pending: int, max_draft: int) -> int | None:
    """The fixed number of rows a forward of `pending` pairs is padded to: one (the usual case
    after a rejection), else the loop's k + 1 (after a verify accepted the whole draft); None
    (unpadded, eager) for more than that, as after a prefill."""
    if pending == 1:
        return 1
    return max_draft + 1 if pending <= max_draft + 1 else None


def feed_pending(steps: Any, ctx: DraftContext, drafter: str, eager: bool = False, embed: nn.Module | None = None
                 ) -> torch.Tensor | None:
    """Run the real pairs not yet cached through a head's fixed-shape steps
    (`specdec.drafters.head_steps.HeadSteps`: padded to `pending_rows`, or eagerly and unpadded
    when `eager`, as after a prefill); return the head's output at the last of them [1, H], or
    None when every pair is cached."""
    pairs = pending_pairs(ctx, steps.length, drafter, embed)
    if pairs is None:
        return None
    rows = None if eager else pending_rows(pairs[0].shape[0], ctx.engine.max_draft)
    return steps(rows, *pairs)[-1:]  # (1, H)


def chain_inputs(ctx: DraftContext, k: int, sampled: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chain draft's positions of the fed-back pairs (d_i, f̂) [k - 1], at T - 1, T, ..., and
    its draws' uniforms [k] from the step's generator (None when `sampled` is false)."""
    device = ctx.tokens.device
    positions = torch.arange(k - 1, device=device) + ctx.tokens.shape[0] - 1
    return positions, torch.rand(k, generator=ctx.generator, device=device) if sampled else None
