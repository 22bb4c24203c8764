"""Uncertainty of the figures specdec publishes: a percentile bootstrap over prompts.

A mean accepted length is a ratio of sums over prompts (tokens emitted / target forwards), and a
speedup one too (plain seconds / drafter seconds), so both are resampled the same way: draw the
prompts with replacement, recompute the ratio of the sums, and read the interval off the
resampled ratios' quantiles (Efron and Tibshirani 1993, ch. 13). Two drafters run on the same
prompts are compared *paired*: each resample draws one set of prompts for both and keeps the
difference of their ratios, so what the prompts share (a prompt every drafter finds easy) cancels.
A ranking stands only where the paired interval excludes zero; otherwise the two share a rank.

The resamples come from a seeded `torch.Generator`, so the same counts give the same interval on
every machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

__all__ = ["LEVEL", "RESAMPLES", "Interval", "paired_difference", "rank_labels", "ranks", "ratio_interval"]

LEVEL = 0.95
RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    """An estimate and its bootstrap interval at `level`."""

    estimate: float
    low: float
    high: float
    level: float = LEVEL

    def excludes(self, value: float) -> bool:
        return value < self.low or value > self.high

    def format(self, digits: int = 2, suffix: str = "") -> str:
        """'2.98 [2.71, 3.25]' (with `suffix` after each number, e.g. 'x')."""
        return f"{self.estimate:.{digits}f}{suffix} {self.bounds(digits, suffix)}"

    def bounds(self, digits: int = 2, suffix: str = "") -> str:
        """'[2.71, 3.25]'."""
        return f"[{self.low:.{digits}f}{suffix}, {self.high:.{digits}f}{suffix}]"

    def as_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "level": self.level}

    @classmethod
    def from_dict(cls, record: Mapping[str, float]) -> Interval:
        return cls(record["estimate"], record["low"], record["high"], record.get("level", LEVEL))


def _draws(units: int, resamples: int, seed: int) -> torch.Tensor:
    """LongTensor [resamples, units]: each row the units drawn with replacement."""
    if units < 1:
        raise ValueError("a bootstrap needs at least one prompt")
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, units, (resamples, units), generator=generator)


def _quantiles(values: torch.Tensor, level: float) -> tuple[float, float]:
    """The (1 - level)/2 and (1 + level)/2 empirical quantiles of a 1-D tensor (sorted order
    statistics, no interpolation, so the figure does not depend on a library's rule)."""
    ordered = values.sort().values
    last = ordered.shape[0] - 1
    below = int((1 - level) / 2 * last)  # as many order statistics cut at each end
    return float(ordered[below]), float(ordered[last - below])


def _ratios(numerators: torch.Tensor, denominators: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """[resamples]: sum(numerators) / sum(denominators) over each resample's prompts."""
    return numerators[draws].sum(dim=1) / denominators[draws].sum(dim=1).clamp_min(1e-300)


def _check(numerators: Sequence[float], denominators: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    if not numerators and not denominators:
        raise ValueError("a bootstrap needs at least one prompt")
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} numerators against {len(denominators)} denominators")
    num = torch.tensor([float(x) for x in numerators], dtype=torch.float64)
    den = torch.tensor([float(x) for x in denominators], dtype=torch.float64)
    if bool((den < 0).any()) or float(den.sum()) <= 0:
        raise ValueError("a ratio's denominators must be non-negative with a positive sum")
    return num, den


def ratio_interval(numerators: Sequence[float], denominators: Sequence[float], level: float = LEVEL,
                   resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    """sum(numerators) / sum(denominators), one term per prompt, with its bootstrap interval.

    Mean accepted length: numerators the tokens each prompt emitted, denominators its target
    forwards. Speedup: plain decoding's seconds per prompt over the drafter's.
    """
    num, den = _check(numerators, denominators)
    low, high = _quantiles(_ratios(num, den, _draws(num.shape[0], resamples, seed)), level)
    return Interval(float(num.sum() / den.sum()), low, high, level)


def paired_difference(a: tuple[Sequence[float], Sequence[float]], b: tuple[Sequence[float], Sequence[float]],
                      level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    """ratio(a) - ratio(b) over the same prompts, each resample drawing one set of prompts for both."""
    num_a, den_a = _check(*a)
    num_b, den_b = _check(*b)
    if num_a.shape != num_b.shape:
        raise ValueError(f"a paired comparison needs the same prompts: {num_a.shape[0]} against {num_b.shape[0]}")
    draws = _draws(num_a.shape[0], resamples, seed)
    differences = _ratios(num_a, den_a, draws) - _ratios(num_b, den_b, draws)
    low, high = _quantiles(differences, level)
    return Interval(float(num_a.sum() / den_a.sum() - num_b.sum() / den_b.sum()), low, high, level)


def ranks(counts: Mapping[str, tuple[Sequence[float], Sequence[float]]], level: float = LEVEL,
          resamples: int = RESAMPLES, seed: int = 0) -> dict[str, int]:
    """Each name's rank by its ratio, highest first, as far as the intervals support it.

    Walking down the names by estimate, a name opens a new rank (its place in that order) only
    when its paired difference from the first name of the current rank excludes zero; otherwise
    it shares that rank. Ranks so never contradict the estimates' order, and names the paired
    intervals cannot tell apart share one ("1, 1, 3": the first two tied)."""
    order = sorted(counts, key=lambda name: -_ratio_of(counts[name]))
    out: dict[str, int] = {}
    leader = None
    for place, name in enumerate(order, start=1):
        if leader is None or paired_difference(counts[leader], counts[name], level, resamples, seed).low > 0:
            leader = name
            out[name] = place
        else:
            out[name] = out[leader]
    return {name: out[name] for name in counts}


def _ratio_of(pair: tuple[Sequence[float], Sequence[float]]) -> float:
    num, den = _check(*pair)
    return float(num.sum() / den.sum())


def rank_labels(ranked: Mapping[str, int]) -> dict[str, str]:
    """'3' for a rank held alone, '=3' for one shared with another name."""
    held: dict[int, int] = {}
    for rank in ranked.values():
        held[rank] = held.get(rank, 0) + 1
    return {name: ("=" if held[rank] > 1 else "") + str(rank) for name, rank in ranked.items()}
