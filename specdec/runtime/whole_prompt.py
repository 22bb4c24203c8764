"""A forward over a whole prompt (a prefill), marked so that a quantized model may run it on its
fastest kernels rather than its row-exact ones (`docs/engine.md`, *Quantized weights*).

A verify row must compute what a one-row step computes, bit for bit, so a quantized model's decode
steps use products and attention whose rows do not depend on how many rows they have
(`specdec.runtime.quantize`, `specdec.runtime.exact_attention`). A prompt's forward is never
compared with another: plain and speculative decoding of the same prompt both run this one
forward, and both continue from the cache and logits it leaves. So inside `whole_prompt()` an
int8 product runs oneDNN's bfloat16 GEMM on the dequantized weights and attention runs torch's
SDPA (save where a soft cap or sinks keep it on the row-exact attention): a 660-token prompt's
forward on SmolLM2 int8 took 2.1 s on the row-exact kernels and takes 0.73 s on these.

The mark is given explicitly, where a generation feeds its prompt (`CausalLM.forward(...,
prompt=True)` from the decode loop's prefill, a batch's prefill, a draft model's own prefill),
never inferred from a forward's shape: a hybrid model's replay of accepted tokens, for one, is
as long as a prompt and must run the row-exact kernels.

It is per thread, and a compiled graph never reads it (`in_whole_prompt` is False while
dynamo traces), so a compiled step is always row-exact; prompts run eagerly.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

__all__ = ["in_whole_prompt", "whole_prompt"]

_STATE = threading.local()


@contextlib.contextmanager
def whole_prompt() -> Iterator[None]:
    """Mark the forwards run inside as a prompt's forward (nests; per thread)."""
    _STATE.depth = getattr(_STATE, "depth", 0) + 1
    try:
        yield
    finally:
        _STATE.depth -= 1


def in_whole_prompt() -> bool:
    """Whether the forward running now is a prompt's (never while dynamo traces a step)."""
    return not torch.compiler.is_compiling() and getattr(_STATE, "depth", 0) > 0
