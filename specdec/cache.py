"""KV caches of transformers models: creation, length, crops, and snapshots of recurrent state.

All knowledge of transformers' cache classes lives here (transformers 5.x: `DynamicCache.crop`
takes a negative count of tokens to remove). With `activate_past_recording`, sliding-window
layers and the conv states of linear-attention layers keep what a crop needs, so `crop` cuts
them back exactly. The recurrent state of a linear-attention layer (GatedDeltaNet, SSM) is a
running sum that no crop can undo: `snapshot` copies it (fixed size) before a forward, and
`restore` crops everything else and copies it back; the caller replays the ids in between.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import transformers
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import (DYNAMIC_LAYER_TYPE_MAPPING, Cache, CacheLayerMixin, DynamicLayer,
                                      LinearAttentionCacheLayerMixin)

__all__ = ["Snapshot", "cache_length", "check_transformers", "crop_cache", "gather_positions", "has_recurrent_state",
           "new_cache", "restore", "snapshot", "tree_obstacle", "uncroppable_layers"]

MINIMUM_TRANSFORMERS = (5, 24)  # forwards take `cache=` from 5.24 on
_STATELESS_LAYER_TYPES = ("moe", "mlp")  # cache layers transformers replaces with dummies


def check_transformers() -> None:
    """Raise if the installed transformers predates the `cache=` forward argument."""
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    if (major, minor) < MINIMUM_TRANSFORMERS:
        raise RuntimeError(f"specdec needs transformers >= 5.24 (forwards take `cache=`), found "
                           f"{transformers.__version__}; pip install 'transformers>=5.24,<5.25'")


def new_cache(model: PreTrainedModel) -> Cache:
    """An empty dynamic cache laid out for `model` (per-layer types from its config), recording
    the past so that attention layers and conv states crop exactly."""
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()
    return cache


def uncroppable_layers(model: PreTrainedModel) -> list[str]:
    """Kinds of layer whose state can neither be cropped nor snapshotted and restored.

    Linear-attention layers (recurrent and conv state) are restorable and not listed; a model
    needs at least one attention layer, which is what tells the cache's length.
    """
    config = model.config.get_text_config()
    known = set(DYNAMIC_LAYER_TYPE_MAPPING) | set(_STATELESS_LAYER_TYPES)
    kinds = {t for t in (getattr(config, "layer_types", None) or []) if t not in known}
    if kinds:
        return sorted(kinds)
    layers = new_cache(model).layers
    for layer in layers:
        if not isinstance(layer, LinearAttentionCacheLayerMixin) and not layer.is_croppable:
            kinds.add(type(layer).__name__)
    if layers and not any(isinstance(layer, CacheLayerMixin) for layer in layers):
        kinds.add("linear-attention-only (no attention layer to count positions)")
    return sorted(kinds)


def has_recurrent_state(cache: Cache) -> bool:
    """Whether the cache has linear-attention layers, whose state a crop alone cannot roll back."""
    return any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers)


def cache_length(cache: Cache | None) -> int:
    """Tokens held by the cache (0 for no cache)."""
    return 0 if cache is None else int(cache.get_seq_length())


def crop_cache(cache: Cache, length: int) -> None:
    """Cut the attention layers and recorded conv states back to the first `length` positions.

    Always crops, even to remove nothing: recording layers trim what they kept for this
    rollback back to their window. Recurrent states are left as they are (see `restore`).
    """
    current = cache_length(cache)
    if length > current or length < 0:
        raise ValueError(f"cannot crop a cache of {current} positions to {length}")
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin) and not any(layer.is_conv_states_initialized.values()):
            continue  # never run: nothing recorded, and its crop would fail on the missing states
        cast(Any, layer).crop(length - current)  # transformers 5.x: negative = tokens to remove


@dataclass(frozen=True)
class Snapshot:
    """The cache's length and, per linear-attention layer and state index, a copy of the
    recurrent state (None where the layer had not run yet)."""

    length: int
    states: dict[tuple[int, int], torch.Tensor | None]


def snapshot(cache: Cache) -> Snapshot:
    """Copy the recurrent states (fixed size: [1, heads, d_k, d_v] per layer) and the length."""
    states: dict[tuple[int, int], torch.Tensor | None] = {}
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            for i in range(layer.number_of_states):
                if not layer.has_previous_state[i]:
                    states[index, i] = None
                elif layer.is_recurrent_states_initialized[i]:  # conv-only layers crop exactly
                    states[index, i] = cast(torch.Tensor, layer.recurrent_states[i]).clone()
    return Snapshot(cache_length(cache), states)


def restore(cache: Cache, saved: Snapshot) -> None:
    """Put the cache back as it was when `saved` was taken, in place.

    Attention layers and conv states are cropped; recurrent states are copied back, and a layer
    that had not run yet forgets its state.
    """
    crop_cache(cache, saved.length)
    for (index, i), state in saved.states.items():
        layer = cast(Any, cache.layers[index])
        if state is not None:
            layer.recurrent_states[i].copy_(state)
        elif layer.has_previous_state[i]:
            LinearAttentionCacheLayerMixin.reset(layer)  # the linear part only; the next forward starts afresh


_TREE_ATTENTION = ("eager", "sdpa")  # implementations that take a custom 4D additive mask


def tree_obstacle(model: PreTrainedModel, cache: Cache) -> str | None:
    """Why `model` cannot verify a token tree in one forward, or None when it can.

    A tree forward needs a custom 4D mask (eager or sdpa attention) and caches whose positions
    can be gathered: full-attention layers only (no sliding window, no recurrent state).
    """
    attention = getattr(model.config, "_attn_implementation", None) or "eager"
    if attention not in _TREE_ATTENTION:
        return (f"its attention implementation {attention!r} takes no custom 4D mask "
                f"(load it with attn_implementation='sdpa' or 'eager')")
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            return "it has linear-attention layers, whose recurrent state cannot hold a tree's branches"
        if type(layer) is not DynamicLayer:
            return f"its {type(layer).__name__} cache layers cannot gather a tree's accepted path"
    return None


def gather_positions(cache: Cache, base: int, rows: list[int]) -> None:
    """Keep the first `base` positions, then the positions base + rows[0], base + rows[1], ...

    After a tree forward appended n + 1 rows at `base`, this moves the accepted path's keys and
    values into place (rows ascending) and drops the rest, in every (full-attention) layer.
    """
    current = cache_length(cache)
    if any(not 0 <= row < current - base for row in rows) or any(a >= b for a, b in zip(rows, rows[1:])):
        raise ValueError(f"cannot gather rows {rows} after position {base} from a cache of {current} positions")
    if rows != list(range(len(rows))):
        source = torch.tensor(rows, dtype=torch.long) + base
        for layer in cache.layers:
            kv = cast(Any, layer)  # full-attention layers (`tree_obstacle` keeps the others out)
            if getattr(kv, "is_initialized", False) and kv.keys is not None and kv.keys.numel():
                index = source.to(kv.keys.device)
                kv.keys[..., base : base + len(rows), :] = kv.keys[..., index, :]
                kv.values[..., base : base + len(rows), :] = kv.values[..., index, :]
    crop_cache(cache, base + len(rows))
