"""Attention computed in float64 from float32 queries, keys and values (`"sdpa_float64"`), which a
quantized model runs (`specdec.runtime.quantize`).

A verify of k + 1 rows and a one-row step multiply the same queries and keys in products of other
shapes, so their float32 scores and outputs may differ in the last bits (torch's attention is not
the same bits for 5 query rows and for 1). A float32 model shrugs that off; a quantized model does
not: its next product casts the attention's output to bfloat16, where a last-bit difference
becomes a whole rounding step now and then, and the steps add up over the layers to logits apart
by hundredths. In float64 those differences sit some 10^-16 below the values, so the outputs
rounded back to float32 are the same bits in a verify row and in a one-row step (save for a
difference that lands on a float32 rounding boundary, some 10^-9 of the time), and everything
after them is computed row by row. The cost grows with the cache: on SmolLM2 int8 it and the LM
head's float32 top logits took about a tenth of a step on a short prompt; after 700 cached
positions it is most of the step, and int8 decodes no faster than float32 (`docs/bench.md`,
*Beside llama.cpp*).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["WIDE_ATTENTION", "register_wide_attention"]

WIDE_ATTENTION = "sdpa_float64"  # the attention implementation's name in transformers' registry


def _wide_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention on float64 copies of its inputs; the output in the query's dtype.
    Shapes as transformers passes them: query (B, H, Q, D), key and value (B, H_kv, T, D)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mask = attention_mask
    if mask is not None and mask.is_floating_point():
        mask = mask.double()  # an additive mask takes the scores' dtype
    out, _ = sdpa_attention_forward(module, query.double(), key.double(), value.double(), mask, **kwargs)
    return out.to(query.dtype), None


def register_wide_attention() -> str:
    """Register `WIDE_ATTENTION` with transformers (once) and return its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(WIDE_ATTENTION, _wide_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(WIDE_ATTENTION, sdpa_mask)  # its masks are SDPA's
    return WIDE_ATTENTION
