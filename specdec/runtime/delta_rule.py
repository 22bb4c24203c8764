"""The gated delta rule over a token tree, keeping the state after every row: the math of a
linear-attention layer's verify forward (Yang, Kautz and Hatamizadeh 2025, "Gated Delta Networks:
Improving Mamba2 with Delta Rule"), as Qwen3-Next and Qwen3.5 use it.

A row's state is its parent's state decayed and corrected by its own key and value:
    S = exp(g) * S_parent;  S = S + beta * k (v - S^T k)^T;  out = S^T q / sqrt(d_k)
with q and k L2-normalised. Rows may branch (a token tree): each row starts from its own parent's
state, so a rejected branch never touches the accepted one. `parents` index the rows of the same
call (-1: the state before the call, `tip`). The short causal convolution in front of the rule
reads each row's ancestors likewise (`tree_conv`). Pure functions, fixed shapes: they compile.
"""

from __future__ import annotations

import torch

__all__ = ["gated_delta_chain", "gated_delta_tree", "tree_conv"]


def gated_delta_tree(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, tip: torch.Tensor, parents: torch.Tensor, depth: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs [B, n, Hv, Dv] and the state after each row [B, n, Hv, Dk, Dv] of n rows.

    query, key [B, n, Hk, Dk] (Hk divides Hv: each serves Hv / Hk value heads), value
    [B, n, Hv, Dv], g and beta [B, n, Hv]; tip [B, Hv, Dk, Dv] the state before the rows; parents
    [B, n] each row's parent row (-1: tip, else an earlier row); `depth` at least the deepest
    row's number of ancestors among the rows plus one (a chain of n rows: n). Computed in float32,
    or in the inputs' dtype when wider, as transformers' kernels do; the states keep that dtype.
    """
    query, key, value, decay, beta = _prepared(query, key, value, g, beta)
    dtype = value.dtype
    batch, rows = parents.shape
    start = torch.cat([tip.to(dtype)[:, None], torch.zeros(batch, rows, *tip.shape[1:], dtype=dtype,
                                                              device=tip.device)], dim=1)  # (B, 1 + n, Hv, Dk, Dv)
    index = (parents + 1)[:, :, None, None, None].expand(-1, -1, *tip.shape[1:])  # (B, n, Hv, Dk, Dv)
    states = start[:, 1:]
    for _ in range(depth):  # after pass d every row of depth <= d holds its exact state
        before = torch.cat([start[:, :1], states], dim=1).gather(1, index) * decay  # (B, n, Hv, Dk, Dv)
        recalled = torch.einsum("bnhkv,bnhk->bnhv", before, key)
        delta = (value - recalled) * beta[..., None]  # (B, n, Hv, Dv)
        states = before + key[..., :, None] * delta[..., None, :]
    out = torch.einsum("bnhkv,bnhk->bnhv", states, query)
    return out, states


def gated_delta_chain(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                      beta: torch.Tensor, tip: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`gated_delta_tree` for a chain (each row's parent the row before it): one step per row,
    n state updates where the tree form's passes take n * n."""
    query, key, value, decay, beta = _prepared(query, key, value, g, beta)
    state = tip.to(value.dtype)  # (B, Hv, Dk, Dv)
    states = []
    for row in range(value.shape[1]):
        state = state * decay[:, row]
        delta = (value[:, row] - torch.einsum("bhkv,bhk->bhv", state, key[:, row])) * beta[:, row, :, None]
        state = state + key[:, row, :, :, None] * delta[:, :, None, :]
        states.append(state)
    stacked = torch.stack(states, dim=1)  # (B, n, Hv, Dk, Dv)
    return torch.einsum("bnhkv,bnhk->bnhv", stacked, query), stacked


def _prepared(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rule's inputs in its dtype (float32, or wider): q and k grouped out to the value heads,
    L2-normalised, q scaled by 1 / sqrt(Dk); the decay exp(g) [B, n, Hv, 1, 1]."""
    dtype = torch.promote_types(value.dtype, torch.float32)
    heads = value.shape[2]
    query, key = (_l2norm(x.to(dtype).repeat_interleave(heads // x.shape[2], dim=2)) for x in (query, key))
    query = query / query.shape[-1] ** 0.5
    return query, key, value.to(dtype), g.to(dtype).exp()[..., None, None], beta.to(dtype)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum x^2 + 1e-6) over the last dimension (the rule's normalisation of q and k)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def tree_conv(pool: torch.Tensor, ancestors: torch.Tensor, inputs: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
    """The depthwise causal convolution of n rows, each over its own ancestors: [B, C, n].

    pool [B, C, P] holds the inputs a row may reach before the call (and may include the rows'
    own slots, unread); ancestors [B, n, K - 1] index a row's K - 1 previous inputs, oldest first,
    into cat(pool, inputs) [B, C, P + n]; inputs [B, C, n] the rows' own; weight [C, K]; no
    activation (the caller applies the layer's). Summed in float32 at least, returned in the
    inputs' dtype."""
    dtype = torch.promote_types(inputs.dtype, torch.float32)
    both = torch.cat([pool, inputs], dim=-1).to(dtype)  # (B, C, P + n)
    batch, channels = both.shape[:2]
    rows, width = ancestors.shape[1:]
    index = ancestors.reshape(batch, 1, rows * width).expand(-1, channels, -1)
    window = both.gather(2, index).reshape(batch, channels, rows, width)  # (B, C, n, K - 1)
    window = torch.cat([window, inputs.to(dtype)[..., None]], dim=-1)  # (B, C, n, K)
    out = (window * weight[None, :, None, :].to(dtype)).sum(-1)  # (B, C, n)
    out = out if bias is None else out + bias[None, :, None].to(dtype)
    return out.to(inputs.dtype)
