"""Checks that a drafter kept its promise: a well-formed draft, and a q its tokens could come from."""

from __future__ import annotations

import torch

from specdec.types import Draft

__all__ = ["DraftError", "validate_draft"]


class DraftError(ValueError):
    """A drafter returned a malformed draft; the message names the drafter and the fault."""


def _fail(drafter: str, problem: str) -> DraftError:
    return DraftError(f"drafter {drafter!r} returned a broken draft: {problem}")


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-3 if dtype in (torch.float32, torch.float64) else 2e-2


def validate_draft(draft: object, max_tokens: int, vocab_size: int, device: torch.device,
                   drafter: str) -> None:
    """Raise DraftError unless `draft` is a Draft of at most `max_tokens` in-vocabulary ids on
    `device`, with `probs` either None or [k', V] finite, normalised rows giving each token q > 0.
    """
    if not isinstance(draft, Draft):
        raise _fail(drafter, f"expected a specdec.Draft, got {type(draft).__name__}")
    tokens, probs = draft.tokens, draft.probs
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise _fail(drafter, f"tokens must be a 1-D LongTensor [k'], got {shape}")
    if tokens.dtype != torch.long:
        raise _fail(drafter, f"tokens must have dtype torch.long, got {tokens.dtype}")
    if tokens.shape[0] > max_tokens:
        raise _fail(drafter, f"{tokens.shape[0]} tokens proposed but at most k={max_tokens} allowed")
    if tokens.device != device:
        raise _fail(drafter, f"tokens are on {tokens.device}, the target on {device}")
    k = tokens.shape[0]
    if k and bool(((tokens < 0) | (tokens >= vocab_size)).any()):
        bad = [t for t in tokens.tolist() if not 0 <= t < vocab_size]
        raise _fail(drafter, f"token id(s) {bad} outside the vocabulary [0, {vocab_size})")
    if probs is None:
        return
    if not isinstance(probs, torch.Tensor) or tuple(probs.shape) != (k, vocab_size):
        shape = tuple(probs.shape) if isinstance(probs, torch.Tensor) else type(probs).__name__
        raise _fail(drafter, f"probs must have shape [k'={k}, V={vocab_size}], got {shape}")
    if not probs.is_floating_point():
        raise _fail(drafter, f"probs must be floating point, got {probs.dtype}")
    if probs.device != device:
        raise _fail(drafter, f"probs are on {probs.device}, the target on {device}")
    if k == 0:
        return
    tolerance = _tolerance(probs.dtype)
    finite = torch.isfinite(probs).all()
    sums = probs.sum(-1)  # (k,)
    q_d = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (k,)
    ok = finite & (probs >= 0).all() & ((sums - 1).abs() <= tolerance).all() & (q_d > 0).all()
    if bool(ok):
        return
    if not bool(finite):
        raise _fail(drafter, "probs contain NaN or infinite values")
    if not bool((probs >= 0).all()):
        raise _fail(drafter, "probs contain negative values")
    for i, (total, q_token) in enumerate(zip(sums.tolist(), q_d.tolist())):
        if abs(total - 1) > tolerance:
            raise _fail(drafter, f"probs row {i} sums to {total:.6g}, not 1 (pass q after softmax)")
        if q_token <= 0:
            raise _fail(drafter, f"q(d) = 0 at position {i} for drafted token "
                                 f"{int(tokens[i])}: it cannot have been sampled from that q")
