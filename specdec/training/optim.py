"""Optimisation settings shared by every trainer: AdamW (Loshchilov & Hutter 2019) with linear
warm-up and cosine decay to a tenth of the peak, gradient clipping, and a progress bar."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Steps", "learning_rate", "make_optimizer", "progress", "set_learning_rate"]


@dataclass(frozen=True)
class Steps:
    """How long and how hard to train: optimizer steps of `batch` windows of `seq_len` tokens."""

    steps: int
    batch: int
    seq_len: int
    lr: float
    seed: int = 0
    weight_decay: float = 0.01
    warmup: float = 0.1  # fraction of the steps
    clip: float = 1.0

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.seq_len < 4:
            raise ValueError(f"seq_len must be >= 4 (heads predict several tokens ahead), got {self.seq_len}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")


def learning_rate(step: int, steps: int, peak: float, warmup: float = 0.1) -> float:
    """Linear warm-up over the first `warmup` fraction, then cosine decay to peak / 10."""
    warm = max(1, int(steps * warmup))
    if step < warm:
        return peak * (step + 1) / warm
    done = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))


def make_optimizer(parameters: Iterable[nn.Parameter], settings: Steps) -> torch.optim.Optimizer:
    """AdamW over the parameters that require gradients."""
    trainable = [p for p in parameters if p.requires_grad]
    if not trainable:
        raise ValueError("nothing to train: no parameter requires gradients")
    return torch.optim.AdamW(trainable, lr=settings.lr, weight_decay=settings.weight_decay, betas=(0.9, 0.95))


def set_learning_rate(optimizer: torch.optim.Optimizer, value: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = value


def progress(total: int, description: str, enabled: bool) -> Any:
    """A tqdm bar on stderr (a no-op object when disabled)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, disable=not enabled, dynamic_ncols=True, mininterval=0.5,
                leave=True, unit="step")
