"""Checks that a drafter kept its promise: a well-formed draft, and a q its tokens could come from."""

from __future__ import annotations

import torch

from specdec.types import Draft, ExtraRows
from specdec.verifier.siblings import sibling_fault

__all__ = ["DraftError", "draft_faults", "validate_draft"]


class DraftError(ValueError):
    """A drafter returned a malformed draft; the message names the drafter and the fault."""


def _fail(drafter: str, problem: str) -> DraftError:
    return DraftError(f"drafter {drafter!r} returned a broken draft: {problem}")


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-3 if dtype in (torch.float32, torch.float64) else 2e-2


def validate_draft(draft: object, max_tokens: int, vocab_size: int, device: torch.device,
                   drafter: str, values: bool = True, extra_rows: int = 0) -> list[int] | None:
    """Raise DraftError unless `draft` is a Draft of in-vocabulary ids on `device`, with `probs`
    either None or [n, V] finite, normalised rows giving each token q > 0, and `extra` None or
    at most `extra_rows` well-formed rows (`ExtraRows`: in-vocabulary ids, offsets >= 1).

    A chain holds at most `max_tokens` ids; a tree (`parents` given) any number of nodes in
    topological order, at most `max_tokens` deep. Returns the parents as a list (None for a chain).
    values=False checks only what the host knows (types, shapes, devices, a tree's parents);
    the ids' and probabilities' values are then left to `draft_faults`, read back later.
    """
    if not isinstance(draft, Draft):
        raise _fail(drafter, f"expected a specdec.Draft, got {type(draft).__name__}")
    if draft.extra is not None:
        _check_extra(draft.extra, extra_rows, vocab_size, device, drafter, values)
    tokens, probs = draft.tokens, draft.probs
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise _fail(drafter, f"tokens must be a 1-D LongTensor [k'], got {shape}")
    if tokens.dtype != torch.long:
        raise _fail(drafter, f"tokens must have dtype torch.long, got {tokens.dtype}")
    parents = _tree_parents(draft.parents, tokens.shape[0], max_tokens, drafter)
    if parents is None and tokens.shape[0] > max_tokens:
        raise _fail(drafter, f"{tokens.shape[0]} tokens proposed but at most k={max_tokens} allowed")
    if tokens.device != device:
        raise _fail(drafter, f"tokens are on {tokens.device}, the target on {device}")
    k = tokens.shape[0]
    if values and k and bool(((tokens < 0) | (tokens >= vocab_size)).any()):
        bad = [t for t in tokens.tolist() if not 0 <= t < vocab_size]
        raise _fail(drafter, f"token id(s) {bad} outside the vocabulary [0, {vocab_size})")
    fault = sibling_fault(draft.siblings, tokens.tolist() if parents is not None else None, parents,
                          probs if isinstance(probs, torch.Tensor) else None)
    if fault is not None:
        raise _fail(drafter, fault)
    if probs is None:
        return parents
    if not isinstance(probs, torch.Tensor) or tuple(probs.shape) != (k, vocab_size):
        shape = tuple(probs.shape) if isinstance(probs, torch.Tensor) else type(probs).__name__
        raise _fail(drafter, f"probs must have shape [k'={k}, V={vocab_size}], got {shape}")
    if not probs.is_floating_point():
        raise _fail(drafter, f"probs must be floating point, got {probs.dtype}")
    if probs.device != device:
        raise _fail(drafter, f"probs are on {probs.device}, the target on {device}")
    if k == 0 or not values:
        return parents
    tolerance = _tolerance(probs.dtype)
    finite = torch.isfinite(probs).all()
    sums = probs.sum(-1)  # (k,)
    q_d = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (k,)
    ok = finite & (probs >= 0).all() & ((sums - 1).abs() <= tolerance).all() & (q_d > 0).all()
    if bool(ok):
        return parents
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
    return parents


def draft_faults(draft: Draft, vocab_size: int) -> torch.Tensor:
    """Whether the values of a draft that passed `validate_draft(..., values=False)` break the
    contract: ids outside the vocabulary, or probs not finite, negative, not normalised, or
    giving a drafted token q = 0. A 0-d bool on the draft's device, computed without reading
    anything back, so the decode loop folds it into its one read per step; `validate_draft`
    then names the fault."""
    tokens, probs = draft.tokens, draft.probs
    bad = ((tokens < 0) | (tokens >= vocab_size)).any()  # (,)
    if probs is not None and tokens.numel():
        q_d = probs.gather(-1, tokens.clamp(0, vocab_size - 1).unsqueeze(-1)).squeeze(-1)  # (k,)
        normalised = ((probs.sum(-1) - 1).abs() <= _tolerance(probs.dtype)).all()
        bad = bad | ~torch.isfinite(probs).all() | (probs < 0).any() | ~normalised | (q_d <= 0).any()
    return bad


def _check_extra(extra: object, limit: int, vocab_size: int, device: torch.device, drafter: str,
                 values: bool) -> None:
    """Extra rows: tokens and positions LongTensor [m], visible BoolTensor [m, m], on `device`,
    m <= limit; with `values`, ids in [0, V) and position offsets >= 1."""
    if not isinstance(extra, ExtraRows):
        raise _fail(drafter, f"extra must be a specdec.types.ExtraRows or None, got {type(extra).__name__}")
    tensors = {"tokens": extra.tokens, "positions": extra.positions, "visible": extra.visible}
    for field, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise _fail(drafter, f"extra.{field} must be a tensor, got {type(tensor).__name__}")
        if tensor.device != device:
            raise _fail(drafter, f"extra.{field} is on {tensor.device}, the target on {device}")
    tokens, positions, visible = extra.tokens, extra.positions, extra.visible
    if tokens.dim() != 1 or tokens.dtype != torch.long:
        raise _fail(drafter, f"extra.tokens must be a 1-D LongTensor [m], got {tuple(tokens.shape)} {tokens.dtype}")
    m = tokens.shape[0]
    if tuple(positions.shape) != (m,) or positions.dtype != torch.long:
        raise _fail(drafter, f"extra.positions must be a LongTensor [m={m}], got {tuple(positions.shape)} "
                             f"{positions.dtype}")
    if tuple(visible.shape) != (m, m) or visible.dtype != torch.bool:
        raise _fail(drafter, f"extra.visible must be a BoolTensor [m={m}, m={m}], got {tuple(visible.shape)} "
                             f"{visible.dtype}")
    if m > limit:
        said = f"its extra_rows() is {limit}" if limit else "it declares no extra_rows()"
        raise _fail(drafter, f"{m} extra rows, but {said}; declare the most extra rows a draft carries")
    if not values or m == 0:
        return
    bad = [t for t in tokens.tolist() if not 0 <= t < vocab_size]
    if bad:
        raise _fail(drafter, f"extra token id(s) {bad} outside the vocabulary [0, {vocab_size})")
    low = [p for p in positions.tolist() if p < 1]
    if low:
        raise _fail(drafter, f"extra position offset(s) {low} below 1 (offset 0 is the last committed token)")


def _tree_parents(parents: object, n: int, max_depth: int, drafter: str) -> list[int] | None:
    """The parent list of a tree draft, checked: [n] long, parents[i] in [-1, i), depth <= max_depth."""
    if parents is None:
        return None
    if not isinstance(parents, torch.Tensor) or parents.dim() != 1 or parents.shape[0] != n \
            or parents.dtype != torch.long:
        shape = (tuple(parents.shape), parents.dtype) if isinstance(parents, torch.Tensor) else type(parents).__name__
        raise _fail(drafter, f"parents must be a LongTensor [n={n}] (one parent index per node), got {shape}")
    listed = parents.tolist()
    depth: list[int] = []
    for i, parent in enumerate(listed):
        if not -1 <= parent < i:
            raise _fail(drafter, f"parents[{i}] = {parent}: a node's parent must come before it "
                                 f"(-1 for a child of the last committed token, else an index < {i})")
        depth.append(1 if parent < 0 else depth[parent] + 1)
    if depth and max(depth) > max_depth:
        raise _fail(drafter, f"the tree is {max(depth)} tokens deep but at most k={max_depth} allowed")
    return listed
