"""The DFlash drafter's stack (Chen et al. 2026, "DFlash: Block Diffusion for Flash Speculative
Decoding", arXiv 2602.06036): a few Qwen3-style decoder layers with no embedding or LM head of
their own, which draft a whole block in one forward.

The target's hidden states at the drafter's layers, concatenated [n, K * H], are fused into one
context vector per position, c = hidden_norm(fc(features)) [n, H], which every layer projects
with its own k_proj / v_proj (then k_norm and RoPE at the position) into keys and values: the
context is never a query, only keys and values injected into each layer. The block
[last committed id, mask x (B - 1)] is embedded by the target's embedding at positions s .. s + B - 1
(s the last committed id's position) and runs through the layers, each block row attending to
every context key and to every block row (bidirectionally; a layer with a sliding window sees the
block causally and the context within its window, as vLLM and SGLang run such layers). The final
norm's output at block slot j >= 1, read through the target's LM head, is the distribution of
the token at position s + j.

Nothing here keeps state: `context_kv` turns features into each layer's keys and values, which
the drafter caches (`specdec.drafters.parallel.dflash_cache`), and `block` runs a block over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

__all__ = ["DFlashHead", "DFlashSpec", "rms_norm", "rotate"]


@dataclass(frozen=True)
class DFlashSpec:
    """A DFlash checkpoint's configuration.

    layer: the Qwen3 configuration of the draft layers (hidden size = the target's).
    block_size: B, the block drafted per forward: the last committed id and B - 1 masks.
    mask_token_id: the id whose (target) embedding fills the masked slots.
    target_layer_ids: the target decoder layers whose outputs are fused (0-based; the reference
        reads transformers' hidden_states[id + 1]).
    num_target_layers: the target's layer count the drafter was made for (None when not given).
    """

    layer: Qwen3Config
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None = None

    @property
    def sliding(self) -> tuple[int | None, ...]:
        """Each layer's sliding window, None for full attention."""
        types = getattr(self.layer, "layer_types", None) or ["full_attention"] * self.layer.num_hidden_layers
        window = getattr(self.layer, "sliding_window", None)
        return tuple(window if kind == "sliding_attention" and window else None for kind in types)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm over the last dimension, computed in float32: x / rms(x) * weight."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the half-split layout: x [.., n, D] at cos, sin [.., n, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class _Norm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class _Attention(nn.Module):
    """Qwen3 attention's weights (q/k/v/o projections, per-head q_norm and k_norm)."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = _Norm(self.head_dim, config.rms_norm_eps)
        self.k_norm = _Norm(self.head_dim, config.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [R, n, H] -> keys (k_norm, then RoPE) and values [R, kv_heads, n, D]."""
        rows, n, _ = x.shape
        keys = self.k_norm(self.k_proj(x).view(rows, n, self.kv_heads, self.head_dim)).transpose(1, 2)
        values = self.v_proj(x).view(rows, n, self.kv_heads, self.head_dim).transpose(1, 2)
        return rotate(keys, cos[:, None], sin[:, None]), values


class _MLP(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.input_layernorm = _Norm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = _Attention(config)
        self.post_attention_layernorm = _Norm(config.hidden_size, config.rms_norm_eps)
        self.mlp = _MLP(config)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context_keys: torch.Tensor,
                context_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """h [R, B, H] the block; context keys/values [R, kv_heads, C, D]; mask [R, 1, B, C + B]
        (True: attend)."""
        attn = self.self_attn
        rows, block, _ = h.shape
        x = self.input_layernorm(h)
        queries = attn.q_norm(attn.q_proj(x).view(rows, block, attn.heads, attn.head_dim)).transpose(1, 2)
        queries = rotate(queries, cos[:, None], sin[:, None])  # (R, heads, B, D)
        keys, values = attn.keys_values(x, cos, sin)  # (R, kv_heads, B, D) each
        keys = torch.cat([context_keys, keys], dim=2)  # (R, kv_heads, C + B, D)
        values = torch.cat([context_values, values], dim=2)
        if attn.kv_heads != attn.heads:
            keys = keys.repeat_interleave(attn.heads // attn.kv_heads, dim=1)
            values = values.repeat_interleave(attn.heads // attn.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask)  # (R, heads, B, D)
        h = h + attn.o_proj(out.transpose(1, 2).reshape(rows, block, attn.heads * attn.head_dim))
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashHead(nn.Module):
    """The DFlash stack, its parameters named as in the published checkpoints (`fc`,
    `hidden_norm`, `layers.N.*`, `norm`)."""

    def __init__(self, spec: DFlashSpec) -> None:
        super().__init__()
        config = spec.layer
        self.spec = spec
        hidden = config.hidden_size
        self.fc = nn.Linear(len(spec.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = _Norm(hidden, config.rms_norm_eps)
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))
        self.norm = _Norm(hidden, config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.windows = spec.sliding
        self.files: tuple[Path, Path] | None = None  # (config, weights) once loaded from a directory

    @property
    def kv_shape(self) -> tuple[int, int]:
        """(kv_heads, head_dim) of each layer's cached keys and values."""
        attn = self.layers[0].self_attn
        return attn.kv_heads, attn.head_dim

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [R, n, D] at positions [R, n]."""
        probe = torch.empty(0, dtype=dtype, device=positions.device)
        cos, sin = self.rotary_emb(probe, positions)
        return cos.to(dtype), sin.to(dtype)

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The context's keys and values in every layer: features [R, n, K * H] (the target's
        hidden states at the drafter's layers), positions [R, n] -> [(keys, values) [R, kv_heads, n, D]]."""
        context = self.hidden_norm(self.fc(features))  # (R, n, H)
        cos, sin = self.rope(positions, context.dtype)
        return [layer.self_attn.keys_values(context, cos, sin) for layer in self.layers]

    def block(self, embeds: torch.Tensor, positions: torch.Tensor, keys: list[torch.Tensor],
              values: list[torch.Tensor], visible: torch.Tensor) -> torch.Tensor:
        """The block's final hidden states [R, B, H] (before the target's LM head): embeds [R, B, H]
        (the target's embeddings of [last id, mask, ...]), positions [R, B], each layer's context
        keys and values [R, kv_heads, C, D], visible [R, C] (the context columns each row holds)."""
        rows, block, _ = embeds.shape
        cos, sin = self.rope(positions, embeds.dtype)
        columns = visible.shape[1]
        full = torch.cat([visible[:, None, :].expand(rows, block, columns),
                          visible.new_ones(rows, block, block)], dim=2)[:, None]  # (R, 1, B, C + B)
        h = embeds
        for layer, key, value, window in zip(self.layers, keys, values, self.windows):
            mask = full if window is None else self._window(full, positions, window, columns)
            h = layer(h, cos, sin, key, value, mask)
        return self.norm(h)

    @staticmethod
    def _window(full: torch.Tensor, positions: torch.Tensor, window: int, columns: int) -> torch.Tensor:
        """A sliding-window layer's mask: the block seen causally, the context within the window
        (a context column's position is its index)."""
        block = positions.shape[1]
        query = positions[:, :, None]  # (R, B, 1)
        context = torch.arange(columns, device=positions.device)[None, None]  # (1, 1, C)
        near = (query - context) < window  # (R, B, C)
        causal = torch.ones(block, block, dtype=torch.bool, device=positions.device).tril()
        keep = torch.cat([near, causal[None].expand(positions.shape[0], -1, -1)], dim=2)[:, None]
        return full & keep
