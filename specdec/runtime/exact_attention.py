"""Attention whose every query row is the same bits whatever rows come with it and wherever its
visible keys sit in the cache (`"exact_rows"`), which a quantized model runs
(`specdec.runtime.quantize`).

Why. A verify of k + 1 rows and a one-row step multiply the same queries and keys in products of
other shapes, and torch's attention is not the same bits for 5 query rows and for 1 (SDPA's
blocked GEMMs reduce in another order: 2.5e-7 apart on SmolLM2's shapes). A float32 model shrugs
that off; a quantized model does not: its next product casts the attention's output to bfloat16,
where a last-bit difference becomes a whole rounding step now and then, and the steps add up over
the layers to logits apart by hundredths. A tree is harder still: its accepted path sits among
masked siblings, at other cache positions than the one-row steps of plain decoding put it.

How. Each row is computed on its own, from elementwise products and sums, never a GEMM:
- the scores `q . k` are float32 products summed over the head dimension, which is the same for
  every key and every row count (checked for 1 to 17 rows, 256 to 2048 keys, head sizes 64 and
  128, eager and compiled);
- the softmax subtracts the row's largest score and exponentiates in float32, element by element
  (a masked key's weight is exactly 0);
- its two sums over the keys, the weights' total and the weighted values, accumulate in float64,
  from float32 terms that do not depend on where they sit: in whatever order and lanes a kernel
  adds them, the result lies within some 10^-16 of the exact sum, and rounds to the same float32
  save on a rounding boundary, some 10^-9 of the time.

The key positions a row does not see add exact zeros, so a tree node's result is that of its
path laid out as a chain, and a verify row's that of the one-row step at its position
(`tests/test_exact_attention.py`). Compiled, inductor fuses it into a few loops over the cache: on
SmolLM2's shapes with 1024 cached positions one layer takes 0.12 ms for one row and 0.36 ms for
five, where float64 SDPA, which an earlier version ran, took 0.70 and 1.38 ms. Eagerly it runs a
few rows at a time, so as not to hold a product per key at once. A prompt's forward
(`specdec.runtime.whole_prompt`) runs torch's float32 SDPA instead.

A float64 model's attention runs the same way in float64 throughout. It takes grouped keys and
values, boolean or additive masks (transformers' or specdec's), transformers' causal flag, a
logit soft cap (Gemma 2) and attention sinks (gpt-oss's `s_aux`).
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.runtime.whole_prompt import in_whole_prompt

__all__ = ["EXACT_ROWS", "exact_rows_attention", "register_exact_rows"]

EXACT_ROWS = "exact_rows"  # the attention implementation's name in transformers' registry
EAGER_CHUNK_BYTES = 1 << 24  # eagerly, rows at a time whose per-key products fit in this many bytes


def exact_rows_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: query (B, H, Q, D), key and value (B, H_kv, T, D), the mask
    (B or 1, 1 or H, Q, T) boolean (True = seen) or additive, or None. Returns (B, Q, H, D)."""
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
    if in_whole_prompt() and softcap is None and sinks is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if dropout:
        raise ValueError(f"exact_rows attention runs inference only; got dropout={dropout} (call model.eval())")
    batch, heads, rows, size = query.shape
    if heads % key.shape[1]:
        raise ValueError(f"{heads} query heads cannot share {key.shape[1]} key heads evenly")
    scale = scaling if scaling is not None else size**-0.5
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    mask = _additive(attention_mask, rows, key.shape[2], bool(causal), query.device)  # (B', 1 or H, Q, T) or None
    if sinks is not None:
        sinks = sinks.reshape(heads)
    if torch.compiler.is_compiling():
        out = _rows(query, key, value, mask, scale, softcap, sinks)  # one fused graph: no chunks
    else:
        width = 8 if query.dtype == torch.float64 else 4  # bytes of one product per key
        chunk = max(1, EAGER_CHUNK_BYTES // (width * heads * key.shape[2] * size * batch))
        out = torch.cat([_rows(query[:, :, start : start + chunk], key, value, _mask_rows(mask, start, chunk), scale,
                               softcap, sinks) for start in range(0, rows, chunk)], dim=2)
    return out.transpose(1, 2).contiguous(), None


def _additive(mask: torch.Tensor | None, rows: int, keys: int, causal: bool, device: torch.device
              ) -> torch.Tensor | None:
    """The mask as float32 to add to the scores: 0 where seen, float32's lowest where not. None
    with `causal` and several rows is SDPA's causal flag (row i sees keys 0..i)."""
    lowest = torch.finfo(torch.float32).min
    if mask is None:
        if not causal or rows == 1:
            return None
        seen = torch.arange(keys, device=device)[None] <= torch.arange(rows, device=device)[:, None]  # (Q, T)
        mask = seen[None, None]
    mask = mask[..., :keys]  # a mask may be wider than the keys it covers
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(~mask, lowest)
    return mask.to(torch.float32).clamp(min=lowest)


def _mask_rows(mask: torch.Tensor | None, start: int, count: int) -> torch.Tensor | None:
    """The mask of query rows start .. start + count (a mask broadcast over the rows as it is)."""
    if mask is None or mask.shape[-2] == 1:
        return mask
    return mask[..., start : start + count, :]


def _rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float,
          softcap: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
    """Attention of query rows (B, H, q, D) over key, value (B, H_kv, T, D), each row on its own:
    (B, H, q, D) in the query's dtype."""
    batch, heads, rows, size = query.shape
    groups = heads // key.shape[1]
    work = torch.float64 if query.dtype == torch.float64 else torch.float32  # a float64 model keeps its precision
    grouped = query.to(work).reshape(batch, key.shape[1], groups, rows, 1, size)  # (B, H_kv, G, q, 1, D)
    keys = key.to(work)[:, :, None, None]  # (B, H_kv, 1, 1, T, D)
    scores = (grouped * keys).sum(-1) * scale  # (B, H_kv, G, q, T): per key, a sum over D alone
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:  # (B', 1 or H, q, T) -> (B', 1 or H_kv, 1 or G, q, T)
        per_head = mask.shape[1] != 1
        shape = (mask.shape[0], key.shape[1] if per_head else 1, groups if per_head else 1, *mask.shape[2:])
        scores = scores + mask.to(work).reshape(shape)
    top = scores.amax(-1, keepdim=True)  # (B, H_kv, G, q, 1)
    if sinks is not None:  # a per-head logit that joins every row's softmax and adds no value
        sink = sinks.to(work).reshape(1, key.shape[1], groups, 1, 1)
        top = torch.maximum(top, sink)
    weights = torch.exp(scores - top)  # float32, element by element; 0 where masked
    total = weights.double().sum(-1, keepdim=True)  # (B, H_kv, G, q, 1) in float64
    if sinks is not None:
        total = total + torch.exp(sink - top).double()
    values = value.to(work)[:, :, None, None]  # (B, H_kv, 1, 1, T, D)
    out = (weights[..., None] * values).double().sum(-2) / total  # (B, H_kv, G, q, D) in float64
    return out.to(query.dtype).reshape(batch, heads, rows, size)


def register_exact_rows() -> str:
    """Register `EXACT_ROWS` with transformers (once) and return its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(EXACT_ROWS, exact_rows_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(EXACT_ROWS, sdpa_mask)  # its masks are SDPA's
    return EXACT_ROWS
