"""Verification of a chain draft: sampled, deterministic (one-hot q) and greedy.

`chain_verdict` and `greedy_verdict` compute a step's verdict on the device, so the decode loop
reads back one small tensor per step; `verify_chain` and `verify_greedy` return it as a Verdict.
"""

from __future__ import annotations

import torch

from specdec.types import Verdict

__all__ = ["acceptance_probabilities", "chain_verdict", "greedy_verdict", "normalized_residual", "residual_distribution",
           "verify_chain", "verify_greedy"]


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
    return normalized_residual(residual, p)


def normalized_residual(residual: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """residual [V] (non-negative) divided by its mass; `fallback` [V] where the mass is ~0 (the
    target's row there: p ~= q up to rounding, so nothing was lost)."""
    mass = residual.sum()
    floor = 64 * torch.finfo(residual.dtype).eps
    return torch.where(mass > floor, residual / mass.clamp(min=floor), fallback)


def chain_verdict(
    p: torch.Tensor,
    tokens: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Speculative sampling over a chain draft, computed on the tensors' device (nothing is read
    back to the host).

    p: [k + 1, V] processed target distributions; tokens: [k]; q: [k, V] or None.
    Draws k uniforms, then one token (correction or bonus) from `generator`.
    Returns (num_accepted: 0-d long, out [k + 1]: the draft with the last token written at
    index num_accepted, so out[: num_accepted + 1] is what the step emits; acceptance [k],
    uniforms [k]; both None when k = 0).
    """
    k = tokens.shape[0]
    if k == 0:
        last = torch.multinomial(p[0], 1, generator=generator)  # (1,)
        return torch.zeros((), dtype=torch.long, device=p.device), last, None, None
    if q is not None:  # rows validated to sum to 1 within rounding; sampling used them normalised
        q = q.to(p.dtype)
        q = q / q.sum(dim=-1, keepdim=True)
    accept = acceptance_probabilities(p[:k], q, tokens)  # (k,)
    uniforms = torch.rand(k, generator=generator, dtype=accept.dtype, device=accept.device)
    num_accepted = (uniforms < accept).cumprod(0).sum()  # 0-d
    at = num_accepted.clamp(max=k - 1).reshape(1)  # the rejected position, when there is one
    row_q = None if q is None else q.index_select(0, at)[0]
    residual = residual_distribution(p.index_select(0, at)[0], row_q, tokens.index_select(0, at)[0])  # (V,)
    next_distribution = torch.where(num_accepted == k, p[k], residual)  # bonus: the next position's p
    last = torch.multinomial(next_distribution, 1, generator=generator)  # (1,)
    out = torch.cat([tokens, last]).scatter(0, num_accepted.reshape(1), last)  # (k + 1,)
    return num_accepted, out, accept, uniforms


def verify_chain(
    p: torch.Tensor,
    tokens: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> Verdict:
    """Speculative sampling over a chain draft (`chain_verdict`, read back as a Verdict).

    p: [k + 1, V] processed target distributions; tokens: [k]; q: [k, V] or None.
    """
    num_accepted, out, accept, uniforms = chain_verdict(p, tokens, q, generator)
    accepted = int(num_accepted)
    return Verdict(tokens=out[: accepted + 1], num_accepted=accepted, acceptance=accept, uniforms=uniforms)


def greedy_verdict(target_tokens: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                   torch.Tensor]:
    """Greedy verification on the device: (num_accepted 0-d, out [k + 1], matches [k] as 0/1).

    target_tokens: [k + 1] argmax of the target at each position; tokens: [k] draft. While the
    draft equals the argmax both agree, so out = target_tokens and out[: num_accepted + 1] is
    what the step emits: the output equals plain greedy decoding.
    """
    k = tokens.shape[0]
    matches = tokens == target_tokens[:k]  # (k,)
    return matches.cumprod(0).sum(), target_tokens[: k + 1], matches.float()


def greedy_verdicts(target_tokens: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Greedy verification of B chains at once, on the device: the number accepted of each [B].

    target_tokens: [B, w + 1] the target's argmax at each row's positions; tokens: [B, w], row b's
    draft in its first lengths[b] entries (the rest padding, never accepted). As in
    `greedy_verdict`, row b emits target_tokens[b, : num_accepted[b] + 1].
    """
    width = tokens.shape[1]
    drafted = torch.arange(width, device=tokens.device)[None] < lengths[:, None]  # (B, w)
    matches = (tokens == target_tokens[:, :width]) & drafted  # (B, w)
    return matches.long().cumprod(dim=1).sum(dim=1)


def verify_greedy(target_tokens: torch.Tensor, tokens: torch.Tensor) -> Verdict:
    """Greedy verification: accept while the draft equals the target's argmax (`greedy_verdict`).

    target_tokens: [k + 1] argmax of the target at each position; tokens: [k] draft.
    """
    num_accepted, out, matches = greedy_verdict(target_tokens, tokens)
    accepted = int(num_accepted)
    return Verdict(tokens=out[: accepted + 1], num_accepted=accepted, acceptance=matches)
