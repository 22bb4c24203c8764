"""Whole-graph against regional compilation of a zoo-shaped target, as docs/engine.md reports it.

A random 32-layer, hidden-64 Qwen3 (the full zoo target's shape) runs one-token forwards on a
static cache, eagerly or compiled one of four ways; each mode runs in a fresh process on a fresh
inductor cache, and prints the first call's seconds (the compile) and the mean of 200 forwards
after it. Run it alone: a second job on the machine makes the figures meaningless.

    python -m specdec.bench.compile_modes          # every mode
    python -m specdec.bench.compile_modes whole    # one: eager, whole, whole-python, layers, nested
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

__all__ = ["MODES", "main", "measure"]

MODES = ("eager", "whole", "whole-python", "layers", "nested")
CPU_OPTIONS = {"cpp_wrapper": True, "cpp_wrapper_build_separate": True}  # the engine's (specdec.runtime.engine)


def measure(mode: str, forwards: int = 200) -> tuple[float, float]:
    """(seconds of the first call, milliseconds per forward after it) for `mode`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, StaticCache

    from specdec.runtime.forward import prepare_for_compile

    torch.set_num_threads(1)
    config = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=32,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    prepare_for_compile(model)  # transformers' output hooks, installed eagerly as the engine does
    cache = StaticCache(config=config, max_cache_len=256)

    def forward(model: Qwen3ForCausalLM, ids: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, cache=cache, position_ids=position[None], use_cache=True).logits

    step = forward
    if mode == "whole":
        step = torch.compile(forward, fullgraph=True, dynamic=False, options=CPU_OPTIONS)
    elif mode == "whole-python":
        step = torch.compile(forward, fullgraph=True, dynamic=False)
    elif mode == "layers":  # each decoder layer its own compiled region, the Python between them eager
        for layer in model.model.layers:
            layer.compile(dynamic=False, options=CPU_OPTIONS)
    elif mode == "nested":  # one region traced once, reused by every layer inside one whole graph
        layer_class = type(model.model.layers[0])
        layer_class.forward = torch.compiler.nested_compile_region(layer_class.forward)
        step = torch.compile(forward, fullgraph=True, dynamic=False)
    ids = torch.tensor([[5]])
    with torch.inference_mode():
        started = time.perf_counter()
        step(model, ids, torch.tensor([0]))
        first = time.perf_counter() - started
        for position in range(1, 6):
            step(model, ids, torch.tensor([position]))
        started = time.perf_counter()
        for position in range(6, 6 + forwards):
            step(model, ids, torch.tensor([position % 250]))
        per_forward = (time.perf_counter() - started) / forwards * 1e3
    return first, per_forward


def main(argv: list[str] | None = None) -> int:
    modes = list(sys.argv[1:] if argv is None else argv) or list(MODES)
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        print(f"unknown mode {unknown[0]!r}: choose from {', '.join(MODES)}", file=sys.stderr)
        return 2
    if len(modes) > 1:  # each in a fresh process: one mode's graphs and caches never serve another
        return max(subprocess.run([sys.executable, "-m", __spec__.name, mode]).returncode for mode in modes)
    mode = modes[0]
    with tempfile.TemporaryDirectory(prefix="specdec-compile-modes-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # before torch is imported (in `measure`)
        try:
            first, per_forward = measure(mode)
        except Exception as error:  # dynamo and inductor raise many kinds; the first line says which
            print(f"{mode:13s} fails: {type(error).__name__}: {str(error).splitlines()[0][:160]}")
            return 0
    print(f"{mode:13s} first call {first:6.1f} s, then {per_forward:6.2f} ms per forward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
