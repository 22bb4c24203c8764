"""What the learned drafters' batched forms share (`specdec.drafters.feature_heads.feature_batch`,
`specdec.drafters.draft_models.draft_model_batch`): the masks of a padded catch-up, each row's uniforms, the
chain loop of one forward per depth with its draft entries given back, each row's draft, and the
shrinking of a batch cache to the rows still decoding.

A batch cache here is a `BatchHead` (`shrink`) or a `BatchLM` (`shrink`, `draft_chains`): it has
`rows` and `select(rows)`, and a `BatchLM` `base` (the first column of its last forward),
`keep(rows, columns)` and `release(rows, columns)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from specdec.drafters.shared.chains import chain_uniforms
from specdec.protocols import DraftContext
from specdec.sampling import pick
from specdec.types import Draft, Sampling

__all__ = ["draft_chains", "padded_visible", "row_drafts", "row_uniforms", "shrink"]


def padded_visible(counts: torch.Tensor, width: int, device: torch.device, right: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """A catch-up of counts[b] real rows per batch row ([B]) in `width` rows: the real rows first
    (or last, `right`), each seeing the real rows up to itself, a padding row only itself.
    Returns which rows are real [B, R] and what each row sees among them [B, R, R]."""
    column = torch.arange(width)
    counts = counts.cpu()
    real = column[None] >= (width - counts)[:, None] if right else column[None] < counts[:, None]  # (B, R)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    eye = torch.eye(width, dtype=torch.bool)
    visible = (causal[None] & real[:, None, :]) | (eye[None] & ~real[:, :, None])  # (B, R, R)
    return real.to(device), visible.to(device)


def row_uniforms(ctxs: dict[int, DraftContext], slots: dict[int, int], rows: int, n: int, sampled: bool,
                 device: torch.device) -> torch.Tensor | None:
    """The uniforms [B, n] each row's chain draws at: those its batch-1 chain draws from its own
    generator (`chain_uniforms`); idle batch rows draw at 0.5. None when not `sampled`."""
    if not sampled:
        return None
    uniforms = torch.full((rows, n), 0.5, device=device)  # (B, n)
    for row, ctx in ctxs.items():
        draws = chain_uniforms(ctx, n, True)
        assert draws is not None
        uniforms[slots[row]] = draws[:n]
    return uniforms


def draft_chains(cache: Any, logits: torch.Tensor, advance: Callable[[int, torch.Tensor], torch.Tensor],
                 sampling: Sampling, uniforms: torch.Tensor | None, n: int
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every batch row's chain of n tokens from its logits [B, V]: each token by `pick` (argmax, or
    a draw at uniforms[:, i]), each further logits row from `advance(i, tokens)` (one forward of
    one row per batch row on `cache`, feeding token i). The draft entries are kept while the chain
    runs, seen by each row's later steps, and given back after it. Returns tokens [B, n] and
    q [B, n, V] (None when greedy)."""
    every = list(range(cache.rows))
    tokens: list[torch.Tensor] = []
    probs: list[torch.Tensor] = []
    drafted: list[int] = []  # the draft entries' columns
    for i in range(n):
        token, q = pick(logits, sampling, None if uniforms is None else uniforms[:, i])  # (B,), (B, V)
        tokens.append(token)
        if q is not None:
            probs.append(q)
        if i + 1 < n:
            logits = advance(i, token)  # (B, V)
            cache.keep(every, [0] * cache.rows)
            drafted.append(cache.base)
    for column in drafted:
        cache.release(every, [column] * cache.rows)
    return torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None


def row_drafts(ctxs: dict[int, DraftContext], ready: list[int], slots: dict[int, int], k: dict[int, int],
               chain: torch.Tensor, probs: torch.Tensor | None) -> dict[int, Draft]:
    """Each row's draft: the first k[row] tokens of its chain (chain [B, n], probs [B, n, V]) for
    the rows in `ready`, an empty draft for the others."""
    drafts = {row: Draft(ctx.tokens[:0]) for row, ctx in ctxs.items()}
    for row in ready:
        slot, length = slots[row], k[row]
        if length > 0:
            drafts[row] = Draft(chain[slot, :length], None if probs is None else probs[slot, :length])
    return drafts


def shrink(cache: Any, slots: dict[int, int], live: list[int], compile: bool) -> dict[int, int]:
    """Drop the rows that finished from `cache` when they are half of it or more: to the live
    rows, or when compiled to the next power of two at or above their number (idle rows fill the
    rest). Returns the rows' new batch rows."""
    size = 1 << (len(live) - 1).bit_length() if compile else len(live)
    if size >= cache.rows:
        return slots
    dead = [row for row in sorted(slots, key=slots.__getitem__) if row not in live]
    keep = sorted(live + dead[: size - len(live)], key=slots.__getitem__)
    cache.select([slots[row] for row in keep])
    return {row: slot for slot, row in enumerate(keep)}
