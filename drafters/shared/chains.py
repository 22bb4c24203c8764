"""The usual chain draft of the drafters that run their whole chain as one step (the draft model,
EAGLE, EAGLE-3, MTP): how long it is drafted, the uniforms its draws invert, and its cut to k.

A compiled generation runs that step at the loop's k only, so the chain the budget's end asks to
be shorter is drafted whole and cut; both engines draw the same uniforms either way, so compiled
and eager decoding stay alike (`docs/engine.md`, "Fixed shapes").
"""

from __future__ import annotations

import torch

from specdec.protocols import DraftContext
from specdec.types import Draft

__all__ = ["chain_length", "chain_uniforms", "cut_chain"]


def chain_length(ctx: DraftContext, k: int) -> int:
    """How many tokens a drafter drafts when asked for a chain of k: when compiling, the loop's k if
    only the budget's end cuts the draft short (the usual step, one graph, its draft then cut to k:
    a shape met once per generation compiles nothing of its own); else k (eager decoding, and
    `k=auto`'s shorter drafts, which run step by step). Either way the chain's first k tokens are
    drawn alike (`chain_uniforms`)."""
    if ctx.budget is None or not ctx.engine.compile or k <= 0:
        return k
    left = ctx.budget - 1  # the most draft tokens the budget still lets the verify emit
    return ctx.engine.max_draft if k == left < ctx.engine.max_draft else k


def chain_uniforms(ctx: DraftContext, k: int, sampled: bool) -> torch.Tensor | None:
    """The uniforms a chain of k draws at [max(k, the loop's k)], from the step's generator (None
    when not `sampled`): as many whatever k, so that a chain drafted whole and cut
    (`chain_length`) and one drafted short make the same draws."""
    if not sampled:
        return None
    return torch.rand(max(k, ctx.engine.max_draft), generator=ctx.generator, device=ctx.tokens.device)


def cut_chain(tokens: torch.Tensor, probs: torch.Tensor | None, k: int) -> Draft:
    """The first k tokens [k] of a chain drafted to `chain_length` and their q rows [k, V]."""
    return Draft(tokens[:k], None if probs is None else probs[:k])
