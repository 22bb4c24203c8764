"""KV caches of transformers models: creation, length and exact rollback.

All knowledge of transformers' cache classes lives here (transformers 5.x: `DynamicCache.crop`
takes a negative count of tokens to remove; sliding-window layers must record past states to
be croppable; linear-attention state cannot be cropped at all).
"""

from __future__ import annotations

import transformers
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache

__all__ = ["cache_length", "check_transformers", "crop_cache", "new_cache", "uncroppable_layers"]

MINIMUM_TRANSFORMERS = (5, 24)  # forwards take `cache=` from 5.24 on


def check_transformers() -> None:
    """Raise if the installed transformers predates the `cache=` forward argument."""
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    if (major, minor) < MINIMUM_TRANSFORMERS:
        raise RuntimeError(f"specdec needs transformers >= 5.24 (forwards take `cache=`), found "
                           f"{transformers.__version__}; pip install 'transformers>=5.24,<5.25'")

_ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


def new_cache(model: PreTrainedModel) -> Cache:
    """An empty dynamic cache laid out for `model`, every layer able to roll back."""
    cache = DynamicCache(config=model.config)
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()  # sliding-window layers keep what a crop needs
    return cache


def uncroppable_layers(model: PreTrainedModel) -> list[str]:
    """Kinds of layer whose state cannot be cut back to a prefix (linear attention, SSM)."""
    config = model.config.get_text_config()
    kinds = {t for t in (getattr(config, "layer_types", None) or []) if t not in _ATTENTION_LAYER_TYPES}
    for layer in getattr(new_cache(model), "layers", []):
        if not getattr(layer, "is_croppable", True):
            kinds.add(type(layer).__name__)
    return sorted(kinds)


def cache_length(cache: Cache | None) -> int:
    """Tokens held by the cache (0 for no cache)."""
    return 0 if cache is None else int(cache.get_seq_length())


def crop_cache(cache: Cache, length: int) -> None:
    """Cut the cache back to its first `length` positions, in place.

    Always calls `crop`, even to remove nothing: sliding-window layers trim the past states
    they recorded for this rollback back to their window.
    """
    current = cache_length(cache)
    if length > current or length < 0:
        raise ValueError(f"cannot crop a cache of {current} positions to {length}")
    cache.crop(length - current)  # transformers 5.x: negative = tokens to remove
