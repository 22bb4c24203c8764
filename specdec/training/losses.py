"""The losses of the trainers, as pure functions of logits and labels.

Self-distillation (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network"): a
drafter learns the target's whole next-token distribution, not only the text's next token,
because acceptance depends on agreeing with the target, not with the data.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

__all__ = ["next_token_loss", "soft_cross_entropy", "top1_agreement"]


def _wide(x: torch.Tensor) -> torch.Tensor:
    """At least float32 (half-precision logits lose too much in a log-softmax)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def soft_cross_entropy(logits: torch.Tensor, teacher_log_probs: torch.Tensor) -> torch.Tensor:
    """Mean over positions of -sum_v p_teacher(v) log q(v): logits, teacher_log_probs [..., V] -> scalar.

    Equals KL(p_teacher || q) plus the teacher's entropy, a constant: the same gradients.
    """
    log_q = F.log_softmax(_wide(logits), dim=-1)
    return -(_wide(teacher_log_probs).exp() * log_q).sum(-1).mean()


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits [..., V] against labels [...]."""
    return F.cross_entropy(_wide(logits).reshape(-1, logits.shape[-1]), labels.reshape(-1))


def top1_agreement(logits: torch.Tensor, teacher_logits: torch.Tensor) -> float:
    """Share of positions where the argmax of logits [..., V] equals the teacher's."""
    return (logits.argmax(-1) == teacher_logits.argmax(-1)).float().mean().item()
