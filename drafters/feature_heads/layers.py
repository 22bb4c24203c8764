"""Finding a transformers architecture's decoder-layer and rotary classes, for drafter heads
(EAGLE, MTP) built from one or two decoder layers of a named architecture."""

from __future__ import annotations

import sys
from typing import Any

from torch import nn
from transformers import PretrainedConfig

__all__ = ["decoder_layer_classes"]


def decoder_layer_classes(config: PretrainedConfig, drafter: str) -> tuple[type[nn.Module], type[nn.Module]]:
    """The `{Prefix}DecoderLayer` and rotary-embedding classes of the architecture `config` names.

    The rotary class is `{Prefix}RotaryEmbedding`, or `{Prefix}TextRotaryEmbedding` in
    multimodal families such as Qwen3.5.
    """
    import transformers

    names = list(getattr(config, "architectures", None) or [])
    owner: Any = getattr(transformers, names[0], None) if names else None
    if owner is None:
        owner = transformers.MODEL_MAPPING[type(config)]
    module = sys.modules[owner.__module__]
    prefix = owner.__name__.split("For")[0].removesuffix("Model")
    layer = getattr(module, f"{prefix}DecoderLayer", None)
    rotary = getattr(module, f"{prefix}RotaryEmbedding", None) or getattr(module, f"{prefix}TextRotaryEmbedding", None)
    if layer is None or rotary is None:
        raise ValueError(f"{drafter}: architecture {owner.__name__} has no {prefix}DecoderLayer / "
                         f"{prefix}RotaryEmbedding in {module.__name__}; use a Llama-style config")
    return layer, rotary
