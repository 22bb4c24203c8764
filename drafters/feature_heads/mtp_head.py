"""The MTP module as a torch module: stages of (norms, projection, the target's own decoder
layer class forced to full attention, final norm), for the layouts `specdec.drafters.feature_heads.mtp` reads."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import cast

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.masking_utils import create_causal_mask

from specdec.drafters.feature_heads.layers import decoder_layer_classes
from specdec.runtime.cache import new_cache

__all__ = ["MtpHead", "MtpStage", "RMSNorm"]


class RMSNorm(nn.Module):
    """x / rms(x) * w, or * (1 + w) for zero-centred (Gemma-style) weights."""

    def __init__(self, hidden: int, eps: float, zero_centred: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden) if zero_centred else torch.ones(hidden))
        self.eps, self.zero_centred = eps, zero_centred

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 + self.weight if self.zero_centred else self.weight
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * scale


class MtpStage(nn.Module):
    """Norms, the 2H -> H projection, decoder layer(s) and the output norm of one MTP module."""

    def __init__(self, layers: list[nn.Module], hidden: int, eps: float, zero_centred: bool,
                 feed_back_normed: bool) -> None:
        super().__init__()
        self.emb_norm = RMSNorm(hidden, eps, zero_centred)
        self.hidden_norm = RMSNorm(hidden, eps, zero_centred)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList(layers)
        self.out_norm = RMSNorm(hidden, eps, zero_centred)
        self.feed_back_normed = feed_back_normed


class MtpHead(nn.Module):
    """The MTP stages of one target: (embeddings, features) -> (fed-back features, LM-head inputs)."""

    def __init__(self, config: PretrainedConfig, layout: str, stages: int) -> None:
        super().__init__()
        if layout not in ("qwen", "deepseek"):
            raise ValueError(f"mtp: unknown layout {layout!r}; expected 'qwen' or 'deepseek'")
        self.layout, self.base_layers = layout, int(config.num_hidden_layers)
        per_stage = int(getattr(config, "mtp_num_hidden_layers", 1) or 1) if layout == "qwen" else 1
        cache_layers = per_stage if layout == "qwen" else 1
        build = copy.deepcopy(config)  # the target's config, every layer forced to full attention
        build._attn_implementation = "sdpa"
        total = self.base_layers + stages * per_stage
        for name, value in (("layer_types", ["full_attention"] * total), ("sliding_window", None),
                            ("use_sliding_window", False)):
            if hasattr(build, name):
                setattr(build, name, value)
        layer_class, rotary_class = decoder_layer_classes(build, "mtp")
        hidden, eps = int(config.hidden_size), float(getattr(config, "rms_norm_eps", 1e-6))
        built = []
        for s in range(stages):
            layers = []
            for j in range(per_stage):
                index = self.base_layers + s if layout == "deepseek" else self.base_layers + j
                layer = layer_class(build, index)  # the index picks MoE vs dense as in the target
                for module in layer.modules():  # cache slot within the MTP cache
                    if hasattr(module, "layer_idx"):
                        setattr(module, "layer_idx", j if layout == "qwen" else 0)
                layers.append(layer)
            built.append(MtpStage(layers, hidden, eps, zero_centred=layout == "qwen",
                                  feed_back_normed=layout == "qwen"))
        self.stages = nn.ModuleList(built)
        self.config = copy.deepcopy(build)  # what the MTP cache and masks read
        self.config.num_hidden_layers = cache_layers
        if hasattr(self.config, "layer_types"):
            self.config.layer_types = ["full_attention"] * cache_layers
        self.rotary_emb = rotary_class(build)
        self.layer_config = build  # the decoder layers' config (MoE experts read their kernel choice here)
        self.file: Path | str = "the checkpoint"  # for error messages

    def forward(self, depth: int, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: Cache | None = None, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """embeds, features [n, H] or [B, n, H] (training, a batch), positions [n] or [B, n] -> (features to feed back,
        LM-head inputs), each shaped like `embeds`. `mask`: an additive [1, 1, n, C + n] tree mask
        instead of the causal one.

        `depth` (0-based) picks the stage: the last one for depths beyond the stages.
        """
        stage = cast(MtpStage, self.stages[min(depth, len(self.stages) - 1)])
        x = stage.proj(torch.cat([stage.emb_norm(embeds), stage.hidden_norm(features)], dim=-1))
        single = x.dim() == 2
        x = x[None] if single else x  # (B, n, H)
        position_ids = positions if positions.dim() == 2 else positions[None]  # (B or 1, n)
        mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=mask, cache=cache,
                                  position_ids=position_ids)  # a 4D tree mask comes back as it is
        rotary = self.rotary_emb(x, position_ids=position_ids)
        for layer in stage.layers:
            out = layer(x, attention_mask=mask, position_ids=position_ids, cache=cache,
                        use_cache=cache is not None, position_embeddings=rotary)
            x = out[0] if isinstance(out, tuple) else out
        normed = stage.out_norm(x)  # (B, n, H)
        fed_back = normed if stage.feed_back_normed else x
        return (fed_back[0], normed[0]) if single else (fed_back, normed)

    def new_cache(self) -> Cache:
        return new_cache(cast(PreTrainedModel, self))  # only reads .config
