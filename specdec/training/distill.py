"""The one training loop for drafters: each step runs the frozen target once over a batch of
windows and every student takes an AdamW step on what it saw. Training several drafters
together (as the zoo does) costs one target forward per step, not one per drafter."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch
from transformers import PreTrainedModel

from specdec.training.data import WindowSampler
from specdec.training.optim import Steps, learning_rate, make_optimizer, progress, set_learning_rate
from specdec.training.teacher import Student, TeacherBatch, teacher_batch, wanted_layers

__all__ = ["data_parallel_part", "distill", "evaluate"]


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
    rank, ranks = data_parallel_part(settings.batch)
    sampler = WindowSampler(data, settings.seq_len, settings.seed)
    layers = wanted_layers(students)
    optimizers = [make_optimizer(s.module.parameters(), settings) for s in students]
    losses = [_Loss(s) if ranks == 1 else _data_parallel(_Loss(s)) for s in students]
    share = settings.batch // ranks
    last: dict[str, float] = {}
    bar = progress(settings.steps, f"training {', '.join(names)}", show_progress and rank == 0)
    try:
        for step in range(settings.steps):
            windows = sampler(settings.batch)[rank * share : (rank + 1) * share]  # every rank draws the global batch
            batch = replace(teacher_batch(target, windows, layers), part=(rank, ranks))
            for student, optimizer, loss_of in zip(students, optimizers, losses):
                set_learning_rate(optimizer, learning_rate(step, settings.steps, student.lr, settings.warmup))
                loss = loss_of(batch)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"{student.name}: the loss became {loss.item()} at step {step}; "
                                             f"lower the learning rate (--lr, now {student.lr})")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # across ranks, DistributedDataParallel averages the gradients
                torch.nn.utils.clip_grad_norm_(student.module.parameters(), settings.clip)
                optimizer.step()
                last[student.name] = _global_mean(loss.detach(), ranks)
            bar.set_postfix({name: f"{value:.3f}" for name, value in last.items()}, refresh=False)
            bar.update(1)
    finally:
        bar.close()
        for student in students:
            student.module.eval()
    return last


class _Loss(torch.nn.Module):
    """A student's loss as a module over its trainable module, so that DistributedDataParallel
    sees the forward that builds the graph of its parameters."""

    def __init__(self, student: Student) -> None:
        super().__init__()
        self.student = student
        self.inner = student.module

    def forward(self, batch: TeacherBatch) -> torch.Tensor:
        return self.student.loss(batch)


def _data_parallel(loss: _Loss) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    device = next(loss.inner.parameters()).device
    return DistributedDataParallel(loss, device_ids=[device] if device.type == "cuda" else None,
                                   find_unused_parameters=True, broadcast_buffers=False)


def data_parallel_part(batch: int) -> tuple[int, int]:
    """(rank, ranks) of this process's share of each step's `batch` windows: (0, 1) alone; under
    torch.distributed (torchrun), each rank takes batch / ranks contiguous windows."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return 0, 1
    ranks = dist.get_world_size()
    if batch % ranks:
        raise ValueError(f"--batch-size {batch} does not split over {ranks} processes; give a multiple of {ranks}")
    return dist.get_rank(), ranks


def _global_mean(loss: torch.Tensor, ranks: int) -> float:
    """The loss over the global batch: the mean of the ranks' (equal-sized) shares."""
    if ranks == 1:
        return loss.item()
    import torch.distributed as dist

    total = loss.float().cpu() if dist.get_backend() == "gloo" else loss.float()
    dist.all_reduce(total)
    return total.item() / ranks


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
