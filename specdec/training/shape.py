"""What the target and the draft model share: checking a Qwen3 shape and building its config,
and reading a model config's context length."""

from __future__ import annotations

from typing import Any

from transformers import Qwen3_5TextConfig, Qwen3Config

__all__ = ["check_shape", "context_length", "qwen35_config", "qwen3_config"]


def check_shape(what: str, shape: Any, fields: tuple[str, ...] = ("hidden", "layers", "heads", "kv_heads")) -> None:
    """Raise naming `what` and the field when a size is not an int >= 1 or the heads do not divide."""
    for name in fields:
        value = getattr(shape, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} {name} must be an int >= 1, got {value!r}")
    if shape.hidden % shape.heads or shape.heads % shape.kv_heads:
        raise ValueError(f"{what} hidden ({shape.hidden}) must divide by heads ({shape.heads}) and heads by "
                         f"kv_heads ({shape.kv_heads})")


def qwen3_config(shape: Any, vocab_size: int, positions: int, **special: Any) -> Qwen3Config:
    """A tied-embedding Qwen3 config of `shape` (hidden, layers, heads, kv_heads, intermediate);
    `special` holds the special token ids and any other config field."""
    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=shape.intermediate or 3 * shape.hidden,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden // shape.heads, max_position_embeddings=int(positions), tie_word_embeddings=True,
        **special)


def qwen35_config(shape: Any, vocab_size: int, positions: int, **special: Any) -> Qwen3_5TextConfig:
    """A tied-embedding Qwen3.5 (text) config of `shape`: in every four layers three GatedDeltaNet
    linear-attention layers, then one gated full-attention layer, Qwen3.5's 3 : 1 layout (the
    layers must be a multiple of four); the linear layers have `heads` key heads and twice as many
    value heads, each hidden // heads wide, a conv kernel of 4; one MTP module (set by the caller)."""
    if shape.layers % 4:
        raise ValueError(f"a Qwen3.5-layout target has its layers in fours (3 linear-attention, 1 full), got "
                         f"layers={shape.layers}")
    width = shape.hidden // shape.heads
    return Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=shape.intermediate or 3 * shape.hidden,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=width, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (shape.layers // 4),
        linear_num_key_heads=shape.heads, linear_num_value_heads=2 * shape.heads, linear_key_head_dim=width,
        linear_value_head_dim=width, linear_conv_kernel_dim=4, max_position_embeddings=int(positions),
        tie_word_embeddings=True, **special)


def context_length(config: Any, default: int = 2048) -> int:
    """The positions a model config was built for (`max_position_embeddings`, GPT-2's `n_positions`)."""
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or default)
