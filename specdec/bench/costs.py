"""Forward costs of a target, measured: the time of one forward of n new tokens after a cached
prefix, T(n), the quantity in the ideal speedup `MAL * T(1) / (T(k+1) + T_draft)` (design §7)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from specdec.target import CausalLM

__all__ = ["forward_costs", "ideal_speedup", "tree_forward_costs"]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_costs(lm: CausalLM, prefix: torch.Tensor, sizes: list[int], repeats: int,
                  step: Callable[[torch.Tensor, int], None]) -> dict[int, float]:
    """Median seconds of `step(ids, base)` for n new ids after `prefix` [P] is cached, per n in
    `sizes`; the cache is rolled back to the prefix after each, and emptied at the end."""
    if prefix.numel() < 1:
        raise ValueError("forward_costs needs a non-empty prefix")
    lm.reset()
    lm.forward(prefix.to(lm.device), keep=1)
    base = lm.cache_length
    costs: dict[int, float] = {}
    for n in sorted(set(sizes)):
        ids = prefix[-1:].repeat(n).to(lm.device)
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            _synchronize(lm.device)
            start = time.perf_counter()
            step(ids, base)
            _synchronize(lm.device)
            times.append(time.perf_counter() - start)
            lm.rollback(base)
        costs[n] = statistics.median(times[1:])
    lm.reset()
    return costs


@torch.inference_mode()
def forward_costs(lm: CausalLM, prefix: torch.Tensor, sizes: list[int], repeats: int = 7) -> dict[int, float]:
    """Median seconds of a forward of n tokens after `prefix` [P] is cached, for each n in `sizes`.

    The cache is rolled back after each forward, so every timing sees the same prefix; the
    forward keeps the logits of all n positions, as a verify forward does.
    """

    def step(ids: torch.Tensor, base: int) -> None:
        lm.forward(ids, keep=ids.shape[0])

    return _median_costs(lm, prefix, sizes, repeats, step)


@torch.inference_mode()
def tree_forward_costs(lm: CausalLM, prefix: torch.Tensor, sizes: list[int], repeats: int = 7) -> dict[int, float]:
    """Median seconds of a tree verify forward of n rows (the root and n - 1 nodes) after `prefix`:
    the 4D-masked forward, the LM head on the root's row, and gathering the path back into place.

    The tree is a chain of nodes: a tree forward's cost depends on its row count, not its shape.
    """

    def step(ids: torch.Tensor, base: int) -> None:
        lm.forward_tree(ids, list(range(-1, ids.shape[0] - 2))).argmax(0)
        lm.keep_path(base, [0])

    return _median_costs(lm, prefix, sizes, repeats, step)


def ideal_speedup(mean_accepted_length: float, t1: float, t_verify: float, t_draft: float) -> float:
    """MAL * T(1) / (T(k+1) + T_draft): the speedup if nothing but forwards and drafting cost time."""
    denominator = t_verify + t_draft
    return mean_accepted_length * t1 / denominator if denominator > 0 else float("nan")
