"""Temperature scaling of a drafter's next-token distribution (Guo et al. 2017, "On Calibration
of Modern Neural Networks", §4.2): the one temperature τ that makes softmax(logits / τ) the best
probabilistic forecast, on held-out text, of the token the target itself would choose.

Dynamic draft trees (EAGLE-2) rank nodes by the drafter's path probability as an estimate of the
chance the target accepts the path. A small drafter trained by distillation is under-confident
(its top-1 probability far below its top-1 agreement), so its trees come out wide and shallow;
with τ fitted here the values track acceptance and the tree reaches deeper. τ is one scalar:
it never changes which token the drafter ranks first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from specdec.training.teacher import teacher_batch, wanted_layers

__all__ = ["GRID", "calibration_losses", "fit_temperature", "value_temperatures"]

GRID = tuple(math.exp(math.log(0.05) + i * (math.log(4.0) - math.log(0.05)) / 63) for i in range(64))  # 0.05..4


def calibration_losses(logits: torch.Tensor, teacher_log_probs: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood [len(GRID)] of the teacher's argmax under softmax(logits / τ)
    for each τ in GRID; logits, teacher_log_probs [..., V] aligned row by row."""
    flat = logits.reshape(-1, logits.shape[-1]).float()  # (N, V)
    labels = teacher_log_probs.reshape(-1, teacher_log_probs.shape[-1]).argmax(-1)  # (N,)
    out = torch.empty(len(GRID), dtype=torch.float64)
    for i, tau in enumerate(GRID):
        log_probs = torch.log_softmax(flat / tau, dim=-1)
        out[i] = -log_probs.gather(-1, labels[:, None]).double().sum()
    return out


def fit_temperature(losses: torch.Tensor) -> float:
    """The τ of GRID with the smallest loss."""
    return GRID[int(losses.argmin())]


@torch.no_grad()
def value_temperatures(target: PreTrainedModel, students: Sequence[object], windows: torch.Tensor,
                       batch: int = 8) -> dict[str, float]:
    """τ for each student that has `draft_logits(batch) -> (logits, teacher log-probs)`, fitted on
    `windows` [n, T] of held-out text."""
    able = [s for s in students if hasattr(s, "draft_logits")]
    totals = {getattr(s, "name"): torch.zeros(len(GRID), dtype=torch.float64) for s in able}
    for start in range(0, windows.shape[0], batch):
        teacher = teacher_batch(target, windows[start : start + batch], wanted_layers(able))
        for student in able:
            logits, reference = getattr(student, "draft_logits")(teacher)
            totals[getattr(student, "name")] += calibration_losses(logits, reference)
    return {name: round(fit_temperature(losses), 4) for name, losses in totals.items()}
