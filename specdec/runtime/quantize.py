"""Weight-only quantization that keeps speculative decoding exact (`docs/engine.md`, *Quantized
weights*).

A decode step reads every weight once, so its floor is the weights' bytes over the memory
bandwidth; int8 weights are a quarter of float32's. `quantize(model, "int8")` replaces each of the
model's linear layers (`nn.Linear` and GPT-2's `Conv1D`, the LM head included) by `Int8Linear`:
the weight rounded to int8 with one scale per output channel (symmetric, absmax / 127: the
vector-wise weights of LLM.int8(), Dettmers et al. 2022, without its outlier split), the
activations cast to bfloat16 and multiplied by torch's int8 weight-only product
(`aten._weight_int8pack_mm`), which inductor lowers to its C++ GEMM template when the weights are
frozen into a packed step (`specdec.runtime.packed`).

Why weight-only. A verify of k + 1 rows must compute, row by row, what a one-row step computes,
or speculative decoding of the quantized model would not be plain decoding of that model. An
activation scale shared by the rows of a product (per tensor, per batch) would make one row's
result depend on the others; here activations are never scaled at all: each row is cast to
bfloat16 element by element, and the product's rows do not depend on how many rows it has
(`tests/test_quantize.py` checks it bit for bit, eager and compiled).

The kernel rounds its outputs to bfloat16, 8 bits of mantissa: on an LM head that makes the two
largest logits equal often enough (at a logit of 30 the step is 0.125) that greedy decoding would
pick between them by the rounding of the steps before, where any last-bit difference between a
verify and a one-row step (an engine's kernels for other shapes) decides the token. So the LM head
recomputes each row's `EXACT_TOP` largest logits from the same inputs and int8 weights in
float32 (`Int8Linear.exact_top`): its logits then tie no more often than a float32 model's. The
attention a quantized model runs computes each row on its own (`specdec.runtime.exact_attention`),
so a verify row's inputs to the head are a one-row step's to the last bit.

A prompt's forward (`specdec.runtime.whole_prompt`) is compared with no other, so its products
run oneDNN's bfloat16 GEMM on the dequantized weights instead: 2.4x to 4.6x the int8 kernel's
speed per layer on a 660-token prompt's rows.

Embeddings, norms, convolutions and experts' fused weights stay as they are.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from specdec.runtime.whole_prompt import in_whole_prompt

__all__ = ["SCHEMES", "Int8Linear", "quantize", "quantized_scheme"]

Scheme = Literal["int8"]
SCHEMES: tuple[str, ...] = ("int8",)
COMPUTE_DTYPE = torch.bfloat16  # the activations' dtype inside a quantized product (its kernels take it)
EXACT_TOP = 16  # an int8 LM head's largest logits per row, recomputed in float32 (`Int8Linear._exact_top`)
_INT8_MAX = 127


class Int8Linear(nn.Module):
    """`y = x W^T + b` with W stored as int8 [N, K] and one scale per output row [N]: the product
    runs on bfloat16 activations and returns the input's dtype.

    Attributes: `qweight` (int8 [N, K]), `scale` (bfloat16 [N]), `bias` (the layer's own, or None),
    `in_features`, `out_features`."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 exact_top: int = 0) -> None:
        super().__init__()
        if qweight.dtype != torch.int8 or qweight.dim() != 2:
            raise ValueError(f"qweight must be int8 [out, in], got {qweight.dtype} {tuple(qweight.shape)}")
        if scale.shape != qweight.shape[:1]:
            raise ValueError(f"scale must be [{qweight.shape[0]}] (one per output row), got {tuple(scale.shape)}")
        self.out_features, self.in_features = (int(n) for n in qweight.shape)
        self.qweight = nn.Parameter(qweight.contiguous(), requires_grad=False)  # the kernel reads rows
        self.scale = nn.Parameter(scale.to(COMPUTE_DTYPE), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.exact_top = int(exact_top)  # outputs per row recomputed in float32 (an LM head's largest logits)

    @classmethod
    def from_linear(cls, linear: nn.Module) -> Int8Linear:
        """The int8 form of `linear` (an `nn.Linear`, or transformers' `Conv1D` whose weight is
        [in, out]): each output row's scale is its largest magnitude / 127, rounded to bfloat16
        first so that the stored integers are the nearest ones under the scale used."""
        weight = _rows(linear).float()  # (N, K)
        scale = (weight.abs().amax(dim=1) / _INT8_MAX).clamp(min=torch.finfo(COMPUTE_DTYPE).tiny)
        scale = scale.to(COMPUTE_DTYPE)
        qweight = torch.round(weight / scale.float()[:, None]).clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8)
        return cls(qweight, scale, linear.bias)

    def dequantized(self) -> torch.Tensor:
        """The weight the product applies, as float32 [N, K] (for error measurements and tests)."""
        return self.qweight.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        rows = x.reshape(-1, self.in_features).to(COMPUTE_DTYPE)  # (M, K)
        scale = self.scale.to(COMPUTE_DTYPE)  # (N,) a model.to(dtype) casts it; bfloat16 holds it exactly
        if rows.device.type == "cpu" and not in_whole_prompt():
            out = torch.ops.aten._weight_int8pack_mm(rows, self.qweight, scale)  # (M, N) row-exact
        else:  # a dequantized bfloat16 GEMM: where that kernel is not built, and for a prompt's many rows
            out = nn.functional.linear(rows, self.qweight.to(COMPUTE_DTYPE)) * scale  # (oneDNN: 2.4-4.6x as fast)
        if self.exact_top:
            out = self._exact_top(rows, out, scale)
        out = out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def _exact_top(self, rows: torch.Tensor, out: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """`out` (M, N) in float32 with each row's `exact_top` largest outputs recomputed from the
        same bfloat16 inputs and int8 weights, accumulated and kept in float32: the kernel rounds its
        outputs to bfloat16, where an LM head's two largest logits are often equal (and the token
        then chosen by rounding); these are not."""
        top = out.topk(min(self.exact_top, self.out_features), dim=-1).indices  # (M, m)
        weights = self.qweight[top].float() * scale[top].float()[..., None]  # (M, m, K)
        exact = (weights * rows.float()[:, None, :]).sum(-1)  # (M, m)
        return out.float().scatter(-1, top, exact)

    def extra_repr(self) -> str:
        top = f", exact_top={self.exact_top}" if self.exact_top else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{top}"


def _linear_kinds() -> tuple[type[nn.Module], ...]:
    """The layer classes `quantize` replaces: `nn.Linear` and transformers' `Conv1D` (GPT-2's)."""
    from transformers.pytorch_utils import Conv1D

    return (nn.Linear, Conv1D)


def _rows(linear: nn.Module) -> torch.Tensor:
    """`linear`'s weight as [out, in] (a `Conv1D` stores it [in, out])."""
    weight = linear.weight.detach()
    return weight if isinstance(linear, nn.Linear) else weight.T


def quantize(model: nn.Module, scheme: str = "int8") -> nn.Module:
    """Quantize `model`'s linear layers in place to `scheme` ("int8": `Int8Linear`) and return it.
    Tied weights are untied where the LM head is quantized (the embedding keeps its float table).
    A model already quantized is refused, as is a model sharded over ranks."""
    if scheme not in SCHEMES:
        raise ValueError(f"quantization scheme {scheme!r} is not known; choose one of {', '.join(SCHEMES)}")
    already = quantized_scheme(model)
    if already is not None:
        raise ValueError(f"{type(model).__name__} is already quantized ({already}); quantize a float model once")
    kinds = _linear_kinds()
    linears = [(name, module) for name, module in model.named_modules() if type(module) in kinds]
    for name, module in linears:
        weight = module.weight
        if not isinstance(weight, torch.Tensor) or type(weight) not in (torch.Tensor, nn.Parameter):
            raise ValueError(f"{name}'s weight is a {type(weight).__name__} (a sharded model?): quantize the "
                             "model before sharding it, or load it with tp=1")
        if weight.is_meta:
            raise ValueError(f"{name}'s weight is on the meta device: load the model's weights before quantizing")
    head = getattr(model, "get_output_embeddings", lambda: None)()
    for name, module in linears:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = Int8Linear.from_linear(module)
        layer.exact_top = EXACT_TOP if module is head else 0
        setattr(parent, child, layer)
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", lambda: None)()
    for part in {id(c): c for c in (config, text) if c is not None}.values():
        if getattr(part, "tie_word_embeddings", False):
            part.tie_word_embeddings = False  # the head is its own (int8) weight now: nothing may tie it again
    _exact_attention_rows(model)
    model._specdec_quantized = scheme  # type: ignore[assignment]
    return model


def _exact_attention_rows(model: nn.Module) -> None:
    """Run `model`'s SDPA or eager attention row by row (`specdec.runtime.exact_attention`), so that
    a verify row's attention output is a one-row step's to the last bit of float32."""
    from specdec.runtime.exact_attention import register_exact_rows

    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) in ("sdpa", "eager") and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(register_exact_rows())


def quantized_scheme(model: nn.Module) -> str | None:
    """The scheme `model` was quantized with by `quantize`, or None."""
    scheme = getattr(model, "_specdec_quantized", None)
    if scheme is not None:
        return str(scheme)
    return "int8" if any(isinstance(m, Int8Linear) for m in model.modules()) else None
