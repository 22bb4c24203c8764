"""The decode step of a hybrid (GatedDeltaNet) target, before and after its layers kept every row's
state, as docs/bench.md reports it.

A random Qwen3-Next-layout target (linear and full attention at 3 : 1, float32) takes steps of a
5-row verify (k = 4) of which `accepted` rows are kept: on a dynamic cache with a snapshot before
each forward, then a restore and a replay of the kept rows (the design before), and on the static
cache with each row's state kept and the accepted one copied into place, eager and compiled. It
prints the median milliseconds of a step. Run it alone: a second job on the machine makes the
figures meaningless.

    python -m specdec.bench.hybrid_steps            # hidden 512, 8 layers, 30 timed steps
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["MODES", "main", "measure", "target"]

MODES = ("dynamic", "static", "compiled")
ROWS = 5  # a verify at k = 4


def target(hidden: int = 512, layers: int = 8, vocab: int = 8192, seed: int = 0) -> PreTrainedModel:
    """A random Qwen3-Next causal LM: every fourth layer full attention, the others GatedDeltaNet,
    dense MLPs, float32, in eval mode."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    heads = max(hidden // 64, 1)
    config = Qwen3NextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)],
        mlp_only_layers=list(range(layers)), num_attention_heads=heads, num_key_value_heads=max(heads // 4, 1),
        head_dim=64, linear_num_key_heads=max(heads // 2, 1), linear_num_value_heads=heads, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, max_position_embeddings=4096,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return Qwen3NextForCausalLM(config).eval()


def measure(model: PreTrainedModel, mode: str, accepted: int, steps: int = 40, warmup: int = 10,
            prompt: int = 200) -> float:
    """Median seconds of a step (a ROWS-row verify, then a rollback keeping `accepted` rows) of
    `model` decoding in `mode`, after `warmup` steps."""
    import torch

    from specdec.runtime.target import CausalLM

    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prefix, ids = torch.randint(0, vocab, (prompt,), generator=generator), torch.randint(0, vocab, (ROWS,),
                                                                                          generator=generator)
    lm = CausalLM(model)
    capacity = prompt + (steps + warmup) * accepted + 2 * ROWS
    lm.reset(None if mode == "dynamic" else -(-capacity // 256) * 256, compile=mode == "compiled")
    times = []
    with torch.inference_mode():
        lm.forward(prefix, keep=1, prompt=True)
        for _ in range(steps + warmup):
            base = lm.cache_length
            start = time.perf_counter()
            lm.forward(ids, keep=ROWS, rows=None if mode == "dynamic" else ROWS)
            lm.rollback(base + accepted)
            times.append(time.perf_counter() - start)
    return statistics.median(times[warmup:])


def main(argv: list[str] | None = None) -> int:
    """Print the median step of every mode, at 2 and at all 5 rows kept (no arguments)."""
    if argv:
        print(f"specdec.bench.hybrid_steps takes no arguments, got {argv}", file=sys.stderr)
        return 2
    model = target()
    for accepted in (2, ROWS):
        for mode in MODES:
            print(f"{mode:9s} {accepted} of {ROWS} rows kept: {measure(model, mode, accepted) * 1e3:7.2f} ms per step")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
