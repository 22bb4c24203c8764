"""The cost model of a target on this machine: what a forward of n tokens costs against one of a
single token, and how close plain decoding comes to the machine's bounds.

Speculative decoding pays when `MAL * T(1) > T(k+1) + T_draft` (design §7): the verify forward
of k + 1 rows (or of a tree's n rows) must cost little more than one decode step. On a GPU a
decode step is bound by memory bandwidth (every weight read for one token), so T(n) stays flat
until n tokens' FLOPs catch up with the weight bytes; on a CPU the compute bound is near, and
T(n) grows early. This module measures the curve and both bounds:

- T(1), T(k+1) for k = 1..8 and T of 16-, 32- and 64-node trees, eager and compiled
  (`specdec.runtime.timing`, medians of round-robin rounds), each also as a multiple of T(1);
- the LM head's share of each forward: the head's matmul over the kept rows, timed alone, over
  the forward (a 49k-token vocabulary makes the head the largest single matmul of a small model);
- the memory bound of plain decoding, `weight bytes / copy bandwidth` (every weight read once a
  step; a tied embedding counted once, as the head reads it whole), with the bandwidth measured
  by copying a buffer larger than the caches; and the compute bound, `2 * (weights used per
  token) / matmul rate`, with the rate measured on a square float32 matmul;
- the share of the larger bound that compiled plain decoding reaches.

    python -m specdec.bench.cost_model --target DIR --out costs.json     # prints the markdown table
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specdec.runtime.target import CausalLM
from specdec.runtime.timing import forward_costs, tree_forward_costs

__all__ = ["Bounds", "CostModel", "copy_bandwidth", "matmul_rate", "measure", "table"]

CHAINS = tuple(range(1, 10))  # T(n) for n = 1 (plain decoding) and k + 1 for k = 1..8
TREES = (16, 32, 64)  # tree verify forwards of this many nodes (plus the root's row)


def _median_seconds(run: Callable[[], Any], repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second a tensor copy moves (read and write counted) through memory on the CPU."""
    source = torch.ones(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    seconds = _median_seconds(lambda: target.copy_(source), repeats)
    return 2 * source.numel() * 4 / seconds


def matmul_rate(size: int = 2048, repeats: int = 5) -> float:
    """FLOPs per second of a square float32 matmul of `size` on the CPU."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    return 2 * size**3 / _median_seconds(lambda: a @ b, repeats)


@dataclass(frozen=True)
class Bounds:
    """The bounds of one plain decode step (one token)."""

    weight_bytes: int  # bytes read a step: every weight once (a tied embedding once)
    flops: int  # 2 * (weights a token multiplies): the layers and the LM head, not the embedding lookup
    bandwidth: float  # bytes/s, measured
    rate: float  # FLOP/s, measured

    @property
    def memory_seconds(self) -> float:
        return self.weight_bytes / self.bandwidth

    @property
    def compute_seconds(self) -> float:
        return self.flops / self.rate


@dataclass(frozen=True)
class CostModel:
    """T(n) of chains and trees, eager and compiled, the head's share, and the bounds."""

    eager: dict[str, float]  # "chain n" / "tree n" -> seconds
    compiled: dict[str, float]
    head_share: dict[str, float]  # "chain n" / "tree n" -> the LM head's seconds over the compiled forward's
    bounds: Bounds
    threads: int


def _weights(model: torch.nn.Module, lm: CausalLM) -> tuple[int, int]:
    """(bytes of the distinct weights, weights a token multiplies): the embedding table is read
    for one row only, unless the LM head shares it."""
    seen: dict[int, torch.Tensor] = {}
    for parameter in model.parameters():
        seen.setdefault(parameter.data_ptr(), parameter)
    total_bytes = sum(p.numel() * p.element_size() for p in seen.values())
    embedding = lm.embed_tokens.weight
    head = getattr(lm.lm_head, "weight", None)
    multiplied = sum(p.numel() for p in seen.values())
    if head is None or head.data_ptr() != embedding.data_ptr():
        multiplied -= embedding.numel()  # a lookup, not a matmul
    return total_bytes, multiplied


def _head_seconds(lm: CausalLM, rows: int, repeats: int) -> float:
    hidden = torch.randn(rows, lm.hidden_size, dtype=lm.dtype, device=lm.device)
    with torch.inference_mode():
        return _median_seconds(lambda: lm.lm_head(hidden), repeats)


def measure(lm: CausalLM, prefix: torch.Tensor, repeats: int = 15, log: Callable[[str], None] = print) -> CostModel:
    """The cost model of `lm` after `prefix` (a realistic cached length), eager and compiled."""
    results: dict[bool, dict[str, float]] = {}
    for compile in (False, True):
        start = time.perf_counter()
        chains = forward_costs(lm, prefix, list(CHAINS), repeats=repeats, compile=compile)
        trees = tree_forward_costs(lm, prefix, [n + 1 for n in TREES], repeats=repeats, compile=compile)
        results[compile] = {**{f"chain {n}": s for n, s in chains.items()},
                            **{f"tree {n - 1}": s for n, s in trees.items()}}
        log(f"{'compiled' if compile else 'eager'} forwards measured in {time.perf_counter() - start:.0f} s")
    # the head's rows: a chain keeps every row's logits; a tree forward the root's only (the rest on demand)
    head_share = {key: _head_seconds(lm, int(key.split()[1]) if key.startswith("chain") else 1, repeats) / seconds
                  for key, seconds in results[True].items()}
    weight_bytes, multiplied = _weights(lm.model, lm)
    bounds = Bounds(weight_bytes, 2 * multiplied, copy_bandwidth(), matmul_rate())
    return CostModel(results[False], results[True], head_share, bounds, torch.get_num_threads())


def table(costs: CostModel) -> str:
    """The markdown table of `costs`, then the bounds."""
    t1e, t1c = costs.eager["chain 1"], costs.compiled["chain 1"]
    lines = ["| forward | rows | eager ms | × T(1) | compiled ms | × T(1) | LM head share |",
             "|---|---|---|---|---|---|---|"]
    for key in costs.compiled:
        kind, n = key.split()
        label = "plain decoding, T(1)" if key == "chain 1" else (f"chain, k = {int(n) - 1}" if kind == "chain"
                                                                else f"tree of {n} nodes")
        rows = int(n) if kind == "chain" else int(n) + 1
        lines.append(f"| {label} | {rows} | {costs.eager[key] * 1e3:.2f} | {costs.eager[key] / t1e:.2f} | "
                     f"{costs.compiled[key] * 1e3:.2f} | {costs.compiled[key] / t1c:.2f} | "
                     f"{costs.head_share[key]:.0%} |")
    b = costs.bounds
    bound = max(b.memory_seconds, b.compute_seconds)
    lines += ["", f"- weights read per step: {b.weight_bytes / 2**20:.0f} MiB; measured copy bandwidth "
              f"{b.bandwidth / 1e9:.1f} GB/s → memory bound {b.memory_seconds * 1e3:.2f} ms a token",
              f"- FLOPs per token: {b.flops / 1e9:.2f} GFLOP; measured float32 matmul rate {b.rate / 1e9:.0f} GFLOP/s "
              f"→ compute bound {b.compute_seconds * 1e3:.2f} ms a token",
              f"- compiled plain decoding, T(1) = {t1c * 1e3:.2f} ms, reaches {bound / t1c:.0%} of the larger bound "
              f"({'memory' if b.memory_seconds >= b.compute_seconds else 'compute'}); "
              f"{costs.threads} threads"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from specdec.checkpoints import load_causal_lm, load_tokenizer

    parser = argparse.ArgumentParser(prog="python -m specdec.bench.cost_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="a checkpoint directory, a hub id or a GGUF file")
    parser.add_argument("--prefix-tokens", type=int, default=256, help="cached tokens before each forward")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    lm = CausalLM(load_causal_lm(args.target))
    tokenizer = load_tokenizer(args.target)
    text = "The quick brown fox jumps over the lazy dog. " * 64
    prefix = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"][: args.prefix_tokens])
    costs = measure(lm, prefix, args.repeats)
    print(table(costs))
    if args.out is not None:
        args.out.write_text(json.dumps({**asdict(costs), "target": str(args.target)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
