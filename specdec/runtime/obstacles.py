"""What a model can run on, and why not: the static cache (`static_obstacle`), a token tree's one
forward (`tree_obstacle`), a rollback to a prefix at all (`uncroppable_layers`). Each answer is a
reason in words, for the warnings and errors that name it; None means the path serves the model.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedModel
from transformers.cache_utils import (DYNAMIC_LAYER_TYPE_MAPPING, Cache, CacheLayerMixin, DummyLayer, DynamicLayer,
                                      DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin, StaticLayer)

from specdec.runtime.cache import new_cache
from specdec.runtime.linear import LinearStates, served_layers
from specdec.runtime.windows import attention_kinds
from specdec.runtime.exact_attention import EXACT_ROWS

__all__ = ["static_obstacle", "tree_obstacle", "uncroppable_layers"]

_STATELESS_LAYER_TYPES = ("moe", "mlp")  # cache layers transformers replaces with dummies


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


_TREE_ATTENTION = ("eager", "sdpa", EXACT_ROWS)  # implementations that take a custom 4D additive mask


def tree_obstacle(model: PreTrainedModel, cache: Cache) -> str | None:
    """Why `model` cannot verify a token tree in one forward, or None when it can.

    A tree forward needs a custom 4D mask (eager or sdpa attention) and caches whose positions
    can be gathered: full-attention layers, and on a static cache sliding ones too (a dynamic
    cache keeps those in a ring) and GatedDeltaNet layers (each row's state from its parent's).
    """
    attention = getattr(model.config, "_attn_implementation", None) or "eager"
    if attention not in _TREE_ATTENTION:
        return (f"its attention implementation {attention!r} takes no custom 4D mask "
                f"(load it with attn_implementation='sdpa' or 'eager')")
    if "local" in (getattr(model.config, "attention_layers", None) or []):  # GPT-Neo
        return ("its local attention layers cut their window by row index inside the layer, which a tree's rows "
                "(at their depth, not their row) would break")
    for layer in cache.layers:
        if isinstance(layer, LinearStates):
            continue  # each row's state from its parent's (`specdec.runtime.linear`)
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            return ("its linear-attention layers are on a dynamic cache, whose one recurrent state cannot hold a "
                    "tree's branches")
        if type(layer) not in (DynamicLayer, StaticLayer, DummyLayer):
            return f"its {type(layer).__name__} cache layers cannot gather a tree's accepted path"
    return None


def static_obstacle(owner: Any) -> str | None:
    """Why `owner` (a model, or a drafter head with a `.config`) cannot run on a static cache, or None.

    A static cache serves full- and sliding-attention layers (and stateless MoE/MLP layers) of a
    model whose attention masks the cache's unused tail (eager or sdpa attention; flash attention
    reads the whole buffer unless given a 2D mask) and that transformers can run on one
    (`_can_compile_fullgraph`; GPT-Neo's local attention, for one, cannot), and its GatedDeltaNet
    linear-attention layers (`specdec.runtime.linear`). Chunked attention (Llama 4) has no rule
    here, and other recurrent layers (Mamba) roll back only by snapshot and replay; these stay on
    the dynamic cache.
    """
    if isinstance(owner, PreTrainedModel) and getattr(owner, "_can_compile_fullgraph", False) is not True:
        return f"transformers runs {type(owner).__name__} on dynamic caches only (_can_compile_fullgraph is false)"
    attention = getattr(owner.config, "_attn_implementation", None) or "eager"
    if attention not in _TREE_ATTENTION:
        return (f"its attention implementation {attention!r} would read a static cache's stale tail "
                "(load it with attn_implementation='sdpa' or 'eager')")
    layers = new_cache(owner).layers
    recurrent = sum(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in layers)
    if recurrent and served_layers(owner) != recurrent:
        return ("its linear-attention layers are not the GatedDeltaNet layers (Qwen3-Next, Qwen3.5) kept per "
                "position on the static cache; they roll back by snapshot and replay, on a dynamic cache")
    for layer in layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            continue
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer) and not isinstance(layer, DummyLayer):
            return f"its {type(layer).__name__} cache layers cannot be rolled back in a static cache"
    text = owner.config.get_text_config() if hasattr(owner.config, "get_text_config") else owner.config
    odd = sorted({kind for kind in getattr(text, "layer_types", None) or [] if "chunked" in kind})
    if odd:
        return f"its {', '.join(odd)} layers (attention within chunks) have no mask rule on the static cache"
    attention_kinds(owner)  # a sliding layer without a window is refused by name
    return None
