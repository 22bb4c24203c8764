"""Forward costs of a target, measured: the time of one forward of n new tokens after a cached
prefix, T(n), the quantity in the ideal speedup `MAL * T(1) / (T(k+1) + T_draft)` (design §7,
`specdec.bench.report.ideal_speedup`), and the draft tax the zoo records."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from specdec.runtime.target import CausalLM
from specdec.types import Engine

__all__ = ["forward_costs", "tree_forward_costs"]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_costs(lm: CausalLM, prefix: torch.Tensor, sizes: list[int], repeats: int,
                  step: Callable[[torch.Tensor, int], None], compile: bool) -> dict[int, float]:
    """Median seconds of `step(ids, base)` for n new ids after `prefix` [P] is cached, per n in
    `sizes`; the cache is cut back to the prefix after each (nothing committed), and emptied at
    the end, static still.

    The sizes are timed round-robin (one of each per round, after a warm-up round, which also
    compiles them when `compile`), so a slow spell of the machine touches every size alike rather
    than the ones measured during it. The cache is what a generation's would be: static and sized
    alike when compiled (or for a hybrid model), dynamic when an attention model runs eagerly.
    """
    if prefix.numel() < 1:
        raise ValueError("forward_costs needs a non-empty prefix")
    engine = Engine(compile=compile, max_length=prefix.numel() + max(sizes), max_draft=max(sizes))
    capacity = engine.cache_capacity(max(sizes), static=lm.static_eagerly)
    lm.reset(capacity, compile=compile)
    lm.forward(prefix.to(lm.device), keep=1, prompt=True)
    base = lm.cache_length
    ordered = sorted(set(sizes))
    inputs = {n: prefix[-1:].repeat(n).to(lm.device) for n in ordered}
    times: dict[int, list[float]] = {n: [] for n in ordered}
    for round_index in range(repeats + 1):  # round 0 is a warm-up
        for n in ordered:
            _synchronize(lm.device)
            start = time.perf_counter()
            step(inputs[n], base)
            _synchronize(lm.device)
            if round_index:
                times[n].append(time.perf_counter() - start)
            lm.discard(base)
    lm.reset(capacity, compile=compile)
    return {n: statistics.median(values) for n, values in times.items()}


@torch.inference_mode()
def forward_costs(lm: CausalLM, prefix: torch.Tensor, sizes: list[int], repeats: int = 15,
                  compile: bool = False) -> dict[int, float]:
    """Median seconds of a forward of n tokens after `prefix` [P] is cached, for each n in `sizes`,
    as the decode loop runs it: a fixed-shape step, compiled when `compile`.

    The cache is rolled back after each forward, so every timing sees the same prefix; the
    forward keeps the logits of all n positions, as a verify forward does.
    """

    def step(ids: torch.Tensor, base: int) -> None:
        lm.forward(ids, keep=ids.shape[0], rows=ids.shape[0])

    return _median_costs(lm, prefix, sizes, repeats, step, compile)


@torch.inference_mode()
def tree_forward_costs(lm: CausalLM, prefix: torch.Tensor, sizes: list[int], repeats: int = 15,
                       compile: bool = False) -> dict[int, float]:
    """Median seconds of a tree verify forward of n rows (the root and n - 1 nodes) after `prefix`:
    the 4D-masked forward, the LM head on the root's row, and gathering the path back into place.

    The tree is a chain of nodes: a tree forward's cost depends on its row count, not its shape.
    A hybrid target's step leaves the gather out: its commit of the root could not be undone.
    """

    def step(ids: torch.Tensor, base: int) -> None:
        lm.forward_tree(ids, list(range(-1, ids.shape[0] - 2)), rows=ids.shape[0]).argmax(0)
        if not lm.recurrent:
            lm.keep_path(base, [0])

    return _median_costs(lm, prefix, sizes, repeats, step, compile)
