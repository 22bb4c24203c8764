"""KV caches of transformers models: creation, length and exact rollback.

All knowledge of transformers' cache classes lives here (transformers 5.x: `DynamicCache.crop`
takes a negative count of tokens to remove).
"""

from __future__ import annotations

from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache

__all__ = ["cache_length", "crop_cache", "new_cache", "uncroppable_layers"]


def new_cache(model: PreTrainedModel) -> Cache:
    """An empty dynamic cache laid out for `model` (sliding-window layers included)."""
    return DynamicCache(config=model.config)


def uncroppable_layers(model: PreTrainedModel) -> list[str]:
    """Layer types whose state cannot be cut back to a prefix (linear attention, SSM)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layer_types = getattr(config, "layer_types", None) or []
    return sorted({t for t in layer_types if t not in ("full_attention", "sliding_attention")})


def cache_length(cache: Cache | None) -> int:
    """Tokens held by the cache (0 for no cache)."""
    return 0 if cache is None else int(cache.get_seq_length())


def crop_cache(cache: Cache, length: int) -> None:
    """Cut the cache back to its first `length` positions, in place."""
    current = cache_length(cache)
    if length > current or length < 0:
        raise ValueError(f"cannot crop a cache of {current} positions to {length}")
    if length < current:
        cache.crop(length - current)  # transformers 5.x: negative = tokens to remove
