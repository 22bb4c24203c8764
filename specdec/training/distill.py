"""The one training loop for drafters: each step runs the frozen target once over a batch of
windows and every student takes an AdamW step on what it saw. Training several drafters
together (as the zoo does) costs one target forward per step, not one per drafter."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from specdec.training.data import WindowSampler
from specdec.training.optim import Steps, learning_rate, make_optimizer, progress, set_learning_rate
from specdec.training.teacher import Student, teacher_batch, wanted_layers

__all__ = ["distill", "evaluate"]


def distill(target: PreTrainedModel, students: Sequence[Student], data: torch.Tensor, settings: Steps,
            show_progress: bool = True) -> dict[str, float]:
    """Train `students` for `settings.steps` steps on windows of `data` [N]; returns each one's last loss.

    The target is frozen (eval mode, no gradients); students are left in eval mode.
    """
    if not students:
        raise ValueError("distill needs at least one student")
    names = [s.name for s in students]
    if len(set(names)) != len(names):
        raise ValueError(f"students must have distinct names, got {names}")
    target.eval().requires_grad_(False)
    sampler = WindowSampler(data, settings.seq_len, settings.seed)
    layers = wanted_layers(students)
    optimizers = [make_optimizer(s.module.parameters(), settings) for s in students]
    last: dict[str, float] = {}
    bar = progress(settings.steps, f"training {', '.join(names)}", show_progress)
    try:
        for step in range(settings.steps):
            batch = teacher_batch(target, sampler(settings.batch), layers)
            for student, optimizer in zip(students, optimizers):
                set_learning_rate(optimizer, learning_rate(step, settings.steps, student.lr, settings.warmup))
                loss = student.loss(batch)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"{student.name}: the loss became {loss.item()} at step {step}; "
                                             f"lower the learning rate (--lr, now {student.lr})")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(student.module.parameters(), settings.clip)
                optimizer.step()
                last[student.name] = loss.item()
            bar.set_postfix({name: f"{value:.3f}" for name, value in last.items()}, refresh=False)
            bar.update(1)
    finally:
        bar.close()
        for student in students:
            student.module.eval()
    return last


def evaluate(target: PreTrainedModel, students: Sequence[Student], windows: torch.Tensor,
             batch: int = 8) -> dict[str, dict[str, float]]:
    """Each student's held-out figures, averaged over `windows` [n, T] (NaN entries skipped)."""
    totals: dict[str, dict[str, list[float]]] = {s.name: {} for s in students}
    for start in range(0, windows.shape[0], batch):
        teacher = teacher_batch(target, windows[start : start + batch], wanted_layers(students))
        for student in students:
            for key, value in student.evaluate(teacher).items():
                totals[student.name].setdefault(key, []).append(value)
    return {name: {key: _mean(values) for key, values in figures.items()} for name, figures in totals.items()}


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else float("nan")
