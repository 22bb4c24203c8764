"""Sliding-window attention on the static cache: which of a model's attention layers slide and by
how far, and the masks that enforce a window over position-addressed storage.

The static cache (`specdec.runtime.cache.KV`) keeps a sliding layer's keys and values at every
position of the context, as it keeps a full-attention layer's, so rollback is a length, a tree's
accepted path is gathered, and a batch's holes are masked as in any other layer (sliding-window
attention: Beltagy et al. 2020, "Longformer"; Jiang et al. 2023, "Mistral 7B").
The window lives in the 4D mask: a query at position q sees the key at position k only when
q - k < W, transformers' rule. transformers builds that mask itself for a causal forward over
such storage; a forward given an explicit mask (a token tree, a batch, a pipelined model) gets
one mask per kind of layer from `layer_masks`.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Attention", "FULL", "SLIDING", "attention_kinds", "layer_masks", "within_window"]

FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' layer types, the keys of its mask mappings


@dataclass(frozen=True)
class Attention:
    """A model's kinds of attention layer: whether some attend to the whole context (`full`), and
    the window W of those that slide (None when none does)."""

    full: bool
    window: int | None

    @property
    def sliding(self) -> bool:
        return self.window is not None


def attention_kinds(owner: Any) -> Attention:
    """The attention layers of `owner` (a transformers model, or a drafter head: anything with a
    `.config`), as its forward builds their masks, not as its config alone suggests: a model
    slides only if its forward builds transformers' sliding-window mask; a model whose forward
    builds one mask per layer type (`causal_mask_mapping`) slides in the layers its config's
    `layer_types` name; one that builds a single mask (Mistral, Phi-3, Mixtral) applies its window
    to every layer, whatever `layer_types` says. A stray `sliding_window` on a model that never
    slides (Llama) means nothing."""
    config = owner.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    builds = _mask_builders(type(getattr(owner, "base_model", owner)))
    if builds is None or SLIDING not in builds[0] or window is None and not builds[1]:
        return Attention(full=True, window=None)  # no sliding mask (Mistral without a window: none either)
    types = getattr(text, "layer_types", None) if builds[1] else None
    slides = SLIDING in types if types is not None else True
    if slides and not (isinstance(window, int) and window >= 1):
        raise ValueError(f"{type(config).__name__} has sliding-attention layers but sliding_window is {window!r}; "
                         "set it to the window in positions")
    return Attention(full=FULL in types if types is not None else False, window=int(window) if slides else None)


@functools.cache
def _mask_builders(cls: type) -> tuple[str, bool] | None:
    """What a model class's forward does with masks: (the kinds it builds, whether it builds a
    mapping by layer type); None when its source cannot be read (then it is taken to slide nowhere)."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return None
    kinds = (SLIDING if "create_sliding_window_causal_mask" in source else "") + FULL
    return kinds, "causal_mask_mapping" in source


def within_window(visible: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, window: int) -> torch.Tensor:
    """visible [B, R, C] (True = attend) kept only where query position minus key position is
    below `window`: queries [B, R] are the rows' positions, keys [B, C] the columns'."""
    return visible & (queries[:, :, None] - keys[:, None, :] < window)  # (B, R, C)


def layer_masks(kinds: Attention, visible: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor | None,
                dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
    """The additive masks [B, 1, R, C] of a forward whose rows at positions queries [B, R] see the
    columns visible [B, R, C] names, the columns holding positions keys [B, C] (None: no layer
    slides). One mask when every layer is of one kind; a mapping by layer type otherwise, which
    the models that mix kinds (Gemma 2 and 3, GPT-OSS, Cohere2) take in place of one mask."""
    masks = {FULL: visible} if kinds.full else {}
    if kinds.window is not None:
        if keys is None:
            raise ValueError("the sliding layers' mask needs the positions its columns hold")
        masks[SLIDING] = within_window(visible, queries, keys, kinds.window)
    additive = {kind: torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(
        ~seen, torch.finfo(dtype).min)[:, None] for kind, seen in masks.items()}  # (B, 1, R, C) each
    return next(iter(additive.values())) if len(additive) == 1 else additive
