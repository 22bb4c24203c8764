"""Verification of a chain draft: sampled, deterministic (one-hot q) and greedy."""

from __future__ import annotations

import torch

from specdec.types import Verdict

__all__ = ["acceptance_probabilities", "residual_distribution", "verify_chain", "verify_greedy"]


def acceptance_probabilities(
    p: torch.Tensor, q: torch.Tensor | None, tokens: torch.Tensor
) -> torch.Tensor:
    """min(1, p(d_i) / q(d_i)) for each draft token.

    p: [k, V] target rows at the draft positions; q: [k, V] or None (one-hot: q(d_i) = 1);
    tokens: [k]. Returns [k].
    """
    index = tokens.unsqueeze(-1)  # (k, 1)
    p_d = p.gather(-1, index).squeeze(-1)  # (k,)
    if q is None:
        return p_d.clamp(max=1.0)
    q_d = q.to(p.dtype).gather(-1, index).squeeze(-1)  # (k,)
    return (p_d / q_d).clamp(max=1.0)


def residual_distribution(p: torch.Tensor, q: torch.Tensor | None, token: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) for one rejected position; p, q: [V], token: scalar draft id.

    With q = None (one-hot at `token`) this is p with `token` removed, renormalised. When the
    residual mass is ~0 (p ~= q up to rounding) the guard falls back to p.
    """
    if q is None:
        residual = p.scatter(-1, token.reshape(1), 0.0)  # (V,)
    else:
        residual = (p - q.to(p.dtype)).clamp(min=0.0)  # (V,)
    mass = residual.sum()
    floor = 64 * torch.finfo(p.dtype).eps
    return torch.where(mass > floor, residual / mass.clamp(min=floor), p)


def verify_chain(
    p: torch.Tensor,
    tokens: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> Verdict:
    """Speculative sampling over a chain draft.

    p: [k + 1, V] processed target distributions; tokens: [k]; q: [k, V] or None.
    Draws k uniforms, then one token (correction or bonus) from `generator`.
    """
    k = tokens.shape[0]
    if k == 0:
        last = torch.multinomial(p[0], 1, generator=generator)
        return Verdict(tokens=last, num_accepted=0)
    if q is not None:  # rows validated to sum to 1 within rounding; sampling used them normalised
        q = q.to(p.dtype)
        q = q / q.sum(dim=-1, keepdim=True)
    accept = acceptance_probabilities(p[:k], q, tokens)  # (k,)
    uniforms = torch.rand(k, generator=generator, dtype=accept.dtype, device=accept.device)
    num_accepted = int((uniforms < accept).cumprod(0).sum())
    if num_accepted == k:
        next_distribution = p[k]  # bonus: drawn from the next position's p
    else:
        row_q = None if q is None else q[num_accepted]
        next_distribution = residual_distribution(p[num_accepted], row_q, tokens[num_accepted])
    last = torch.multinomial(next_distribution, 1, generator=generator)  # (1,)
    return Verdict(tokens=torch.cat([tokens[:num_accepted], last]), num_accepted=num_accepted, acceptance=accept,
                   uniforms=uniforms)


def verify_greedy(target_tokens: torch.Tensor, tokens: torch.Tensor) -> Verdict:
    """Greedy verification: accept while the draft equals the target's argmax.

    target_tokens: [k + 1] argmax of the target at each position; tokens: [k] draft.
    The correction or bonus is the target's argmax, so the output equals plain greedy decoding.
    """
    k = tokens.shape[0]
    matches = tokens == target_tokens[:k]  # (k,)
    num_accepted = int(matches.cumprod(0).sum()) if k else 0
    return Verdict(tokens=target_tokens[: num_accepted + 1], num_accepted=num_accepted, acceptance=matches.float())
