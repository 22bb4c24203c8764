"""The cost model of a target on this machine: what a forward of n tokens costs against one of a
single token, per engine, and how close plain decoding comes to the machine's floor.

Speculative decoding pays when `MAL * T(1) > T(k+1) + T_draft` (design §7): the verify forward
of k + 1 rows (or of a tree's n rows) must cost little more than one decode step. A decode step
of a model larger than the caches reads every weight once, and a verify of n rows reads the same
bytes, so at the memory floor extra rows are nearly free; a kernel that streams the weights slower
than the memory can, or that switches to a slower kernel for n > 1, makes T(n) grow. This module
measures the curve and the bounds:

- T(1), T(k+1) for k = 1..8 and T of 16-, 32- and 64-node trees (`specdec.runtime.timing`, medians
  of round-robin rounds), for each engine: `eager`, `compiled` (torch's own matrix products) and
  `packed` (the compiled engine with packed weights, inductor's C++ GEMM template:
  `specdec.runtime.packed`), each also as a multiple of its own T(1);
- the LM head's share of each forward: the head's matmul over the kept rows, timed alone, over the
  last engine's forward (a 49k-token vocabulary makes the head the largest single matmul of a
  small model);
- the floor of a forward of n rows, `max(weight bytes / read bandwidth, n * 2 * (weights used per
  token) / matmul rate)`: every weight read once (a tied embedding once, at the bytes it is stored
  in: a quantized model's are int8), with the bandwidth measured by summing a buffer larger than
  the caches (a read, as a step's weights are read, not a copy, which also writes), or every row's
  products at the rate of a square float32 matmul, whichever is longer. Where the weights are
  small (int8) and the cores few, the rows' products pass the memory floor after a few rows, and
  no kernel can make a verify of k + 1 rows cost what one row does;
- the share of the memory floor each engine's plain decoding reaches.

    python -m specdec.bench.cost_model --target DIR --out costs.json     # prints the markdown table
    python -m specdec.bench.cost_model --target DIR --quantize int8 --engines eager packed --chains 1 2 5 9 --trees
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from unittest.mock import patch

import torch

from specdec.runtime.packed import PACKED_ENV
from specdec.runtime.quantize import SCHEMES, quantized_scheme
from specdec.runtime.target import CausalLM
from specdec.runtime.timing import forward_costs, tree_forward_costs

__all__ = ["CHAINS", "ENGINES", "TREES", "Bounds", "CostModel", "floor_seconds", "matmul_rate", "measure",
           "read_bandwidth", "table"]

CHAINS = tuple(range(1, 10))  # T(n) for n = 1 (plain decoding) and k + 1 for k = 1..8
TREES = (16, 32, 64)  # tree verify forwards of this many nodes (plus the root's row)
ENGINES = ("eager", "compiled", "packed")  # packed: compiled with packed weights (`specdec.runtime.packed`)


def _median_seconds(run: Callable[[], Any], repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second the CPU reads from memory: a sum over a buffer larger than the caches,
    which reads every byte once and writes nothing (a step reads its weights; it writes none)."""
    source = torch.ones(megabytes * 2**20 // 4)
    seconds = _median_seconds(lambda: source.sum(), repeats)
    return source.numel() * 4 / seconds


def matmul_rate(size: int = 2048, repeats: int = 5) -> float:
    """FLOPs per second of a square float32 matmul of `size` on the CPU."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    return 2 * size**3 / _median_seconds(lambda: a @ b, repeats)


@dataclass(frozen=True)
class Bounds:
    """The bounds of one plain decode step (one token)."""

    weight_bytes: int  # bytes read a step: every weight once (a tied embedding once), as stored
    flops: int  # 2 * (weights a token multiplies): the layers and the LM head, not the embedding lookup
    bandwidth: float  # bytes/s the CPU reads, measured
    rate: float  # FLOP/s, measured

    @property
    def memory_seconds(self) -> float:
        return self.weight_bytes / self.bandwidth

    @property
    def compute_seconds(self) -> float:
        return self.flops / self.rate


@dataclass(frozen=True)
class CostModel:
    """T(n) of chains and trees per engine, the head's share, and the bounds."""

    curves: dict[str, dict[str, float]]  # engine -> "chain n" / "tree n" -> seconds
    head_share: dict[str, float]  # "chain n" / "tree n" -> the LM head's seconds over the last engine's forward
    bounds: Bounds
    threads: int
    quantized: str | None = None  # the weights' scheme (`specdec.quantize`), None: as loaded


def _weights(model: torch.nn.Module, lm: CausalLM) -> tuple[int, int]:
    """(bytes a step reads, weights a token multiplies): every distinct weight once, but of an
    embedding table the LM head does not share one row (a lookup, not a matmul; a quantized
    model's head has its own int8 copy, so its float table is such a lookup)."""
    seen: dict[int, torch.Tensor] = {}
    for parameter in model.parameters():
        seen.setdefault(parameter.data_ptr(), parameter)
    total_bytes = sum(p.numel() * p.element_size() for p in seen.values())
    embedding = lm.embed_tokens.weight
    head = getattr(lm.lm_head, "weight", None)
    multiplied = sum(p.numel() for p in seen.values())
    if head is None or head.data_ptr() != embedding.data_ptr():
        multiplied -= embedding.numel()
        total_bytes -= (embedding.shape[0] - 1) * embedding[0].numel() * embedding.element_size()
    return total_bytes, multiplied


def _head_seconds(lm: CausalLM, rows: int, repeats: int) -> float:
    hidden = torch.randn(rows, lm.hidden_size, dtype=lm.dtype, device=lm.device)
    with torch.inference_mode():
        return _median_seconds(lambda: lm.lm_head(hidden), repeats)


@contextmanager
def _engine_setting(engine: str) -> Iterator[bool]:
    """Whether `engine` compiles, with packed weights switched as it says while it runs."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    setting = {} if engine == "eager" else {PACKED_ENV: "1" if engine == "packed" else "0"}
    with patch.dict(os.environ, setting):  # puts the environment back as it was
        yield engine != "eager"


def measure(model: torch.nn.Module, prefix: torch.Tensor, repeats: int = 15, log: Callable[[str], None] = print,
            engines: Sequence[str] = ENGINES, chains: Sequence[int] = CHAINS,
            trees: Sequence[int] = TREES) -> CostModel:
    """The cost model of `model` after `prefix` (a realistic cached length), per engine. Each
    engine runs on a wrapper of its own (`CausalLM`), so its steps are its own; a packed engine's
    graphs stay on the model, as the engine keeps them."""
    if not engines or not chains or 1 not in chains:
        raise ValueError(f"measure needs at least one engine and chains including 1 (plain decoding), "
                         f"got engines={list(engines)} chains={list(chains)}")
    curves: dict[str, dict[str, float]] = {}
    for engine in engines:
        start = time.perf_counter()
        with _engine_setting(engine) as compile:
            lm = CausalLM(model)
            measured = {f"chain {n}": s for n, s in
                        forward_costs(lm, prefix, sorted(set(chains)), repeats=repeats, compile=compile).items()}
            if trees:
                measured.update({f"tree {n - 1}": s for n, s in tree_forward_costs(
                    lm, prefix, [n + 1 for n in trees], repeats=repeats, compile=compile).items()})
        curves[engine] = measured
        log(f"{engine} forwards measured in {time.perf_counter() - start:.0f} s")
    last = curves[engines[-1]]
    # the head's rows: a chain keeps every row's logits; a tree forward the root's only (the rest on demand)
    head_share = {key: _head_seconds(lm, int(key.split()[1]) if key.startswith("chain") else 1, repeats) / seconds
                  for key, seconds in last.items()}
    weight_bytes, multiplied = _weights(model, lm)
    bounds = Bounds(weight_bytes, 2 * multiplied, read_bandwidth(), matmul_rate())
    return CostModel(curves, head_share, bounds, torch.get_num_threads(), quantized_scheme(model))


def _label(key: str) -> tuple[str, int]:
    kind, n = key.split()
    if key == "chain 1":
        return "plain decoding, T(1)", 1
    return (f"chain, k = {int(n) - 1}", int(n)) if kind == "chain" else (f"tree of {n} nodes", int(n) + 1)


def floor_seconds(bounds: Bounds, rows: int) -> float:
    """The least a forward of `rows` rows can cost: every weight read once, or each row's products
    at the measured matmul rate, whichever takes longer."""
    return max(bounds.memory_seconds, rows * bounds.compute_seconds)


def table(costs: CostModel) -> str:
    """The markdown table of `costs`: each forward's floor (`floor_seconds`), then each engine's ms
    and multiple of its own T(1); then the bounds and the share of the floor each engine's plain
    decoding reaches."""
    engines = list(costs.curves)
    b = costs.bounds
    head = ("| forward | rows | floor ms | " + " | ".join(f"{engine} ms | × T(1)" for engine in engines)
            + " | LM head share |")
    lines = [head, "|---|---|---|" + "---|---|" * len(engines) + "---|"]
    for key in costs.curves[engines[-1]]:
        label, rows = _label(key)
        cells = []
        for engine in engines:
            seconds, t1 = costs.curves[engine].get(key), costs.curves[engine]["chain 1"]
            cells.append("— | —" if seconds is None else f"{seconds * 1e3:.2f} | {seconds / t1:.2f}")
        lines.append(f"| {label} | {rows} | {floor_seconds(b, rows) * 1e3:.2f} | " + " | ".join(cells)
                     + f" | {costs.head_share[key]:.0%} |")
    stored = f", {costs.quantized} weights" if costs.quantized else ""
    crossover = b.memory_seconds / b.compute_seconds if b.compute_seconds else float("inf")
    lines += ["", f"- weights read per step: {b.weight_bytes / 2**20:.0f} MiB{stored}; measured read bandwidth "
              f"{b.bandwidth / 1e9:.1f} GB/s → memory floor {b.memory_seconds * 1e3:.2f} ms a forward",
              f"- FLOPs per token: {b.flops / 1e9:.2f} GFLOP; measured float32 matmul rate {b.rate / 1e9:.0f} GFLOP/s "
              f"→ compute bound {b.compute_seconds * 1e3:.2f} ms a row; rows cost more than the memory floor "
              f"from {crossover:.1f} rows on",
              "- plain decoding reaches " + ", ".join(
                  f"{b.memory_seconds / costs.curves[e]['chain 1']:.0%} of the floor {e} "
                  f"(T(1) = {costs.curves[e]['chain 1'] * 1e3:.2f} ms)" for e in engines) + f"; {costs.threads} threads"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from specdec.checkpoints import load_causal_lm, load_tokenizer

    parser = argparse.ArgumentParser(prog="python -m specdec.bench.cost_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="a checkpoint directory, a hub id or a GGUF file")
    parser.add_argument("--quantize", choices=SCHEMES, default=None, help="quantize the target first (specdec.quantize)")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES),
                        help="the engines measured, in order (default: all)")
    parser.add_argument("--chains", nargs="+", type=int, default=list(CHAINS), metavar="N",
                        help="rows of the chain forwards (1 = plain decoding, always measured; default 1..9)")
    parser.add_argument("--trees", nargs="*", type=int, default=list(TREES), metavar="N",
                        help="nodes of the tree forwards (default 16 32 64; none: no trees)")
    parser.add_argument("--prefix-tokens", type=int, default=256, help="cached tokens before each forward")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if any(n < 1 for n in [*args.chains, *args.trees]):
        parser.error(f"--chains and --trees take positive counts, got {[*args.chains, *args.trees]}")
    model = load_causal_lm(args.target, quantize=args.quantize)
    tokenizer = load_tokenizer(args.target)
    text = "The quick brown fox jumps over the lazy dog. " * 64
    prefix = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"][: args.prefix_tokens])
    costs = measure(model, prefix, args.repeats, engines=args.engines, chains=sorted({1, *args.chains}),
                    trees=args.trees)
    print(table(costs))
    if args.out is not None:
        args.out.write_text(json.dumps({**asdict(costs), "target": str(args.target)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
