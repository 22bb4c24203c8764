"""Block verification of a chain draft (Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro and
Suresh, ICLR 2025, "Block Verification Accelerates Speculative Decoding").

Token-wise verification stops at the first draft token that fails its test. Block verification
judges the draft as a whole: it keeps a weight w_i, how much of the target's mass the first i
draft tokens still carry against the draft's,

    w_0 = 1,  w_i = min(1, w_{i-1} p_i(d_i) / q_i(d_i)),

and accepts the longest prefix i whose own test passes, each test independent of the others:
the prefix of i tokens is kept with probability h_i, tried from the longest (i = k) down,

    h_k = w_k,  h_i = m_i / (m_i + 1 - w_i)  with  m_i = sum_x max(0, w_i p_{i+1}(x) - q_{i+1}(x)),

after which the next token comes from p_{k+1} (all k kept) or from norm(max(0, w_i p_{i+1} -
q_{i+1})) (i kept). A later prefix can pass where an earlier token's own ratio was below one:
the test of prefix i does not ask that every shorter prefix passed. The output law is exactly
the target's (the paper's Theorem 1; `tests/test_verifier_block.py` enumerates it), and the
expected number of tokens kept is never below token-wise verification's, and the most any rule
that reads only the draft's own probabilities can keep.

With one-hot q (a deterministic draft) every weight is a product of p's and the rule keeps what
sample-and-match keeps on average.
"""

from __future__ import annotations

import torch

from specdec.types import Verdict
from specdec.verifier.chain import normalized_residual

__all__ = ["block_tests", "block_verdict", "block_weights", "kept_prefix", "verify_block"]


def block_weights(p_d: torch.Tensor, q_d: torch.Tensor) -> torch.Tensor:
    """w [k + 1] from the draft tokens' p and q [k]: w_0 = 1, w_i = min(1, w_{i-1} p_d[i-1] / q_d[i-1]).

    Unrolled, w_i = min over j <= i of prod(ratios j+1..i): in logs, the cumulative sum minus its
    running maximum, so the clamp at one needs no loop."""
    ratios = p_d / q_d  # (k,)
    logs = torch.cat([ratios.new_zeros(1), ratios.log().cumsum(0)])  # (k + 1,), -inf once a ratio is 0
    return (logs - logs.cummax(0).values).exp()


def block_tests(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(h [k + 1], residuals [k, V]): the probability h_i of keeping the first i draft tokens when
    no longer prefix was kept (h_0 = 1: nothing kept is the last resort), and the unnormalised
    residual max(0, w_i p_{i+1} - q_{i+1}) the next token is drawn from after keeping i < k.

    p: [k + 1, V]; q: [k, V] (rows summing to 1); tokens: [k]."""
    k = tokens.shape[0]
    index = tokens.unsqueeze(-1)  # (k, 1)
    weights = block_weights(p[:k].gather(-1, index).squeeze(-1), q.gather(-1, index).squeeze(-1))  # (k + 1,)
    residuals = (weights[:k, None] * p[:k] - q).clamp(min=0.0)  # (k, V)
    mass = residuals.sum(-1)  # (k,)
    denominator = mass + 1.0 - weights[:k]
    # 0 / 0 only where w_i = 1 and p_{i+1} = q_{i+1}: nothing is lost there, so keeping i is safe
    h = torch.where(denominator > 0, mass / denominator.clamp(min=torch.finfo(p.dtype).tiny), torch.ones_like(mass))
    h = torch.cat([h, weights[k:]])  # (k + 1,): h_0 .. h_{k-1}, then h_k = w_k
    h[0] = 1.0
    return h, residuals


def kept_prefix(h: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """How many draft tokens are kept (0-d): the longest prefix i >= 1 whose own test passed
    (uniforms[i - 1] < h[i]), else 0. Every test is drawn; a failed shorter one does not stop a
    longer one."""
    k = uniforms.shape[0]
    passed = torch.cat([torch.ones(1, dtype=torch.bool, device=h.device), uniforms < h[1:]])  # (k + 1,)
    return (passed.long() * torch.arange(k + 1, device=h.device)).max()


def block_verdict(
    p: torch.Tensor,
    tokens: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Block verification on the tensors' device, in `chain_verdict`'s form.

    p: [k + 1, V]; tokens: [k]; q: [k, V] or None (one-hot at the draft tokens).
    Draws k uniforms (u_j tests the prefix of j + 1 tokens), then one token from `generator`.
    Returns (num_accepted 0-d, out [k + 1] with the last token at num_accepted, acceptance
    [k] = h_1..h_k, uniforms [k]; both None when k = 0).
    """
    k = tokens.shape[0]
    if k == 0:
        last = torch.multinomial(p[0], 1, generator=generator)  # (1,)
        return torch.zeros((), dtype=torch.long, device=p.device), last, None, None
    if q is None:
        q = torch.zeros(k, p.shape[-1], dtype=p.dtype, device=p.device).scatter_(-1, tokens.unsqueeze(-1), 1.0)
    else:  # rows validated to sum to 1 within rounding; sampling used them normalised
        q = q.to(p.dtype)
        q = q / q.sum(dim=-1, keepdim=True)
    h, residuals = block_tests(p, q, tokens)  # (k + 1,), (k, V)
    uniforms = torch.rand(k, generator=generator, dtype=p.dtype, device=p.device)
    num_accepted = kept_prefix(h, uniforms)
    at = num_accepted.clamp(max=k - 1).reshape(1)
    residual = normalized_residual(residuals.index_select(0, at)[0], p.index_select(0, at)[0])  # (V,)
    next_distribution = torch.where(num_accepted == k, p[k], residual)
    last = torch.multinomial(next_distribution, 1, generator=generator)  # (1,)
    out = torch.cat([tokens, last]).scatter(0, num_accepted.reshape(1), last)  # (k + 1,)
    return num_accepted, out, h[1:], uniforms


def verify_block(
    p: torch.Tensor,
    tokens: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> Verdict:
    """Block verification of a chain draft (`block_verdict`), read back as a Verdict."""
    num_accepted, out, h, uniforms = block_verdict(p, tokens, q, generator)
    accepted = int(num_accepted)
    return Verdict(tokens=out[: accepted + 1], num_accepted=accepted, acceptance=h, uniforms=uniforms)
