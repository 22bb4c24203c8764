"""What a frozen target tells its students about a batch of windows, computed once per batch
and shared by every drafter trained on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel

__all__ = ["Student", "TeacherBatch", "teacher_batch"]


@dataclass(frozen=True)
class TeacherBatch:
    """ids [B, T]; hidden [B, T, H], the target's last-layer post-norm hidden states (the features
    drafters read at decode time); log_probs [B, T, V], its next-token log-probabilities (row t
    predicts ids[:, t + 1])."""

    ids: torch.Tensor
    hidden: torch.Tensor
    log_probs: torch.Tensor


@torch.no_grad()
def teacher_batch(model: PreTrainedModel, ids: torch.Tensor) -> TeacherBatch:
    """One forward of the frozen target over ids [B, T]."""
    out = model(input_ids=ids, output_hidden_states=True)
    logits = out.logits.to(torch.promote_types(out.logits.dtype, torch.float32))
    return TeacherBatch(ids, out.hidden_states[-1], F.log_softmax(logits, dim=-1))


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
