"""Training Medusa heads on the frozen target's hidden states (Cai et al. 2024, "Medusa",
§3.1: Medusa-1 with a frozen backbone; the self-distillation variant of §3.2.1, here on the
target's distributions over the training text).

Head i reads the hidden state at position t and learns the target's distribution at t+1+i
(the token t+2+i), weighted 0.8^i as in the paper. Each head's vocabulary projection starts as
a copy of the target's LM head and its residual blocks at zero, so training starts from
"predict what the target would say next".
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from specdec.drafters.feature_heads.medusa_head import MedusaHeads
from specdec.training.losses import next_token_loss, soft_cross_entropy, top1_agreement
from specdec.training.teacher import TeacherBatch

__all__ = ["MedusaStudent"]

HEAD_DECAY = 0.8


class MedusaStudent:
    """Medusa heads learning the target's distribution 1..K tokens past its own next token."""

    name = "medusa"

    def __init__(self, heads: MedusaHeads, lr: float = 1e-3) -> None:
        self.module: MedusaHeads = heads.train()
        self.lr = lr

    @classmethod
    def create(cls, num_heads: int, num_layers: int, lm_head: nn.Module, seed: int, lr: float = 1e-3
               ) -> MedusaStudent:
        weight = cast(torch.Tensor, lm_head.weight).detach()  # (V, H)
        torch.manual_seed(seed)
        heads = MedusaHeads(num_heads, num_layers, int(weight.shape[1]), int(weight.shape[0]))
        with torch.no_grad():
            for name, parameter in heads.named_parameters():
                if name.endswith(f".{num_layers}.weight"):  # the vocabulary projection
                    parameter.copy_(weight)
                else:  # residual blocks start as the identity
                    parameter.zero_()
        return cls(heads, lr)

    def _pairs(self, batch: TeacherBatch) -> list[tuple[int, torch.Tensor]]:
        T = batch.ids.shape[1]
        logits = self.module(batch.hidden)  # (K, B, T, V)
        return [(i, logits[i, :, : T - 1 - i]) for i in range(self.module.num_heads) if T - 1 - i > 0]

    def loss(self, batch: TeacherBatch) -> torch.Tensor:
        terms = [HEAD_DECAY**i * soft_cross_entropy(logits, batch.log_probs[:, 1 + i :])
                 for i, logits in self._pairs(batch)]
        return torch.stack(terms).sum()

    @torch.no_grad()
    def evaluate(self, batch: TeacherBatch) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, logits in self._pairs(batch):  # head i drafts depth i + 1
            labelled = logits[:, :-1]  # the last row's token lies past the window
            out[f"loss@{i + 1}"] = next_token_loss(labelled, batch.ids[:, 2 + i :]).item() if labelled.shape[1] \
                else float("nan")
            out[f"agreement@{i + 1}"] = top1_agreement(logits, batch.log_probs[:, 1 + i :])
        out["loss"], out["agreement"] = out["loss@1"], out["agreement@1"]
        return out
