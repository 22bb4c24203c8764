"""Training an EAGLE-1 head on the frozen target's features (Li et al. 2024, "EAGLE", §4.2).

At position j the head reads (embed(x_{j+1}), f_j) and predicts f_{j+1}; the loss is the
paper's L_reg + w_cls * L_cls: Smooth-L1 between the predicted and the target's feature, plus
the cross-entropy of the target's LM head on the predicted feature against the target's own
distribution at j+1 (w_cls = 0.1). Input features get uniform noise U(-a, a) as in the
paper's data augmentation, so the head tolerates its own errors when it drafts from them.
The head is a Llama decoder layer, as in the published EAGLE-1 checkpoints.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import LlamaConfig

from specdec.drafters.feature_heads.eagle import EagleHead
from specdec.training.losses import next_token_loss, soft_cross_entropy, top1_agreement
from specdec.training.shape import context_length
from specdec.training.teacher import TeacherBatch

__all__ = ["EagleStudent", "eagle_config", "feature_pairs"]


def eagle_config(target_config: Any, hidden: int, vocab: int) -> LlamaConfig:
    """A one-layer Llama config shaped like the target's layers where the target says how."""
    heads = int(getattr(target_config, "num_attention_heads", 0) or max(1, hidden // 64))
    head_dim = int(getattr(target_config, "head_dim", 0) or hidden // heads)
    return LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=heads,
        num_key_value_heads=int(getattr(target_config, "num_key_value_heads", 0) or heads), head_dim=head_dim,
        intermediate_size=int(getattr(target_config, "intermediate_size", 0) or 4 * hidden),
        rms_norm_eps=float(getattr(target_config, "rms_norm_eps", 1e-6)), max_position_embeddings=context_length(target_config),
        architectures=["LlamaForCausalLM"], bos_token_id=None, eos_token_id=None, pad_token_id=None)


def feature_pairs(embed: nn.Module, batch: TeacherBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (x_{j+1}, f_j) pairs of a batch: embeddings, features [B, T-1, H] and positions [T-1]."""
    with torch.no_grad():
        embeds = embed(batch.ids[:, 1:])
    positions = torch.arange(batch.ids.shape[1] - 1, device=batch.ids.device)
    return embeds, batch.hidden[:, :-1], positions


class EagleStudent:
    """An EAGLE-1 head learning to predict the target's next feature."""

    name = "eagle"

    def __init__(self, head: EagleHead, embed: nn.Module, lm_head: nn.Module, lr: float = 1e-3,
                 cls_weight: float = 0.1, noise: float = 0.1) -> None:
        self.module: EagleHead = head.train()
        self.embed, self.lm_head = embed, lm_head
        self.lr, self.cls_weight, self.noise = lr, cls_weight, noise

    @classmethod
    def create(cls, target: Any, seed: int, lr: float = 1e-3) -> EagleStudent:
        lm_head = target.get_output_embeddings()
        vocab, hidden = (int(n) for n in lm_head.weight.shape)
        torch.manual_seed(seed)
        head = EagleHead(eagle_config(target.config.get_text_config(), hidden, vocab))
        std = 0.02
        with torch.no_grad():
            for name, parameter in head.named_parameters():
                if parameter.dim() == 2:
                    parameter.normal_(0.0, std)
                elif name.endswith("bias"):
                    parameter.zero_()
        return cls(head, target.get_input_embeddings(), lm_head, lr)

    def _predict(self, batch: TeacherBatch, noisy: bool) -> torch.Tensor:
        embeds, features, positions = feature_pairs(self.embed, batch)
        if noisy and self.noise > 0:  # drawn for the step's global batch, so any split of it trains alike
            rank, ranks = batch.part
            shape = (features.shape[0] * ranks, *features.shape[1:])
            uniform = torch.rand(shape, dtype=features.dtype, device=features.device)
            features = features + (uniform[rank * features.shape[0] : (rank + 1) * features.shape[0]] * 2 - 1) \
                * self.noise
        return self.module(embeds, features, positions)  # (B, T-1, H): f̂_1 .. f̂_{T-1}

    def loss(self, batch: TeacherBatch) -> torch.Tensor:
        predicted = self._predict(batch, noisy=True)
        regression = F.smooth_l1_loss(predicted, batch.hidden[:, 1:])
        return regression + self.cls_weight * soft_cross_entropy(self.lm_head(predicted), batch.log_probs[:, 1:])

    @torch.no_grad()
    def draft_logits(self, batch: TeacherBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Its logits for the first drafted token and the target's log-probabilities there."""
        return self.lm_head(self._predict(batch, noisy=False)), batch.log_probs[:, 1:]

    @torch.no_grad()
    def evaluate(self, batch: TeacherBatch) -> dict[str, float]:
        logits = self.lm_head(self._predict(batch, noisy=False))  # (B, T-1, V)
        return {"loss": next_token_loss(logits[:, :-1], batch.ids[:, 2:]).item(),
                "agreement": top1_agreement(logits, batch.log_probs[:, 1:])}
