"""What a frozen target tells its students about a batch of windows, computed once per batch
and shared by every drafter trained on it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel

__all__ = ["Student", "TeacherBatch", "teacher_batch", "wanted_layers"]


@dataclass(frozen=True)
class TeacherBatch:
    """ids [B, T]; hidden [B, T, H], the target's last-layer post-norm hidden states (the features
    drafters read at decode time); log_probs [B, T, V], its next-token log-probabilities (row t
    predicts ids[:, t + 1]); layers: the hidden states [B, T, H] of the layers students asked for
    (`hidden_layers`, transformers' `hidden_states` indices). part (rank, ranks): the windows are
    that contiguous share of a step's global batch, under data parallelism (`distill`), so that a
    student drawing random numbers per window draws for the global batch and keeps its share."""

    ids: torch.Tensor
    hidden: torch.Tensor
    log_probs: torch.Tensor
    layers: dict[int, torch.Tensor] = field(default_factory=dict)
    part: tuple[int, int] = (0, 1)


@torch.no_grad()
def teacher_batch(model: PreTrainedModel, ids: torch.Tensor, layers: Sequence[int] = ()) -> TeacherBatch:
    """One forward of the frozen target over ids [B, T], keeping the hidden states of `layers`."""
    out = model(input_ids=ids, output_hidden_states=True)
    logits = out.logits.to(torch.promote_types(out.logits.dtype, torch.float32))
    kept = {i: out.hidden_states[i] for i in layers}
    return TeacherBatch(ids, out.hidden_states[-1], F.log_softmax(logits, dim=-1), kept)


def wanted_layers(students: Sequence[object]) -> tuple[int, ...]:
    """Every layer some student reads (its `hidden_layers` attribute), in order."""
    return tuple(sorted({i for student in students for i in getattr(student, "hidden_layers", ())}))


class Student(Protocol):
    """A drafter being trained on teacher batches (`specdec.training.distill`)."""

    name: str
    lr: float  # peak learning rate

    @property
    def module(self) -> nn.Module:
        """Its trainable parameters."""
        ...

    def loss(self, batch: TeacherBatch) -> torch.Tensor:
        """The training loss on one batch (a scalar with a graph)."""
        ...

    def evaluate(self, batch: TeacherBatch) -> dict[str, float]:
        """Held-out figures on one batch: `loss` (cross-entropy against the text, nats/token) and
        `agreement` (top-1 equal to the target's), per drafting depth as `loss@d` / `agreement@d`
        when the student drafts several tokens from one input."""
        ...
