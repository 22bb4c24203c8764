"""Training a separate draft model (Leviathan et al. 2023; Chen et al. 2023) by distillation
from the target's next-token distributions: a Qwen3-architecture causal LM on the target's
vocabulary, so any target with any tokenizer can have one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

from specdec.training.losses import next_token_loss, soft_cross_entropy, top1_agreement
from specdec.training.shape import check_shape, context_length, qwen3_config
from specdec.training.teacher import TeacherBatch

__all__ = ["DraftModelStudent", "DraftSize", "draft_config"]


@dataclass(frozen=True)
class DraftSize:
    """The draft model's shape."""

    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int | None = None  # default 3 * hidden

    def __post_init__(self) -> None:
        check_shape("draft model", self)


def draft_config(size: DraftSize, target_config: Any, vocab_size: int) -> Qwen3Config:
    """A Qwen3 config of `size` for the target's vocabulary, special ids and context length."""
    return qwen3_config(
        size, vocab_size, context_length(target_config), bos_token_id=getattr(target_config, "bos_token_id", None),
        eos_token_id=getattr(target_config, "eos_token_id", None),
        pad_token_id=getattr(target_config, "pad_token_id", None))


class DraftModelStudent:
    """A draft model learning the target's next-token distribution at every position."""

    name = "draft-model"

    def __init__(self, model: PreTrainedModel, lr: float = 2e-3) -> None:
        self.module: PreTrainedModel = model.train()
        self.lr = lr

    @classmethod
    def create(cls, size: DraftSize, target: PreTrainedModel, seed: int, lr: float = 2e-3) -> DraftModelStudent:
        torch.manual_seed(seed)
        vocab = int(target.get_output_embeddings().weight.shape[0])
        return cls(Qwen3ForCausalLM(draft_config(size, target.config.get_text_config(), vocab)), lr)

    def loss(self, batch: TeacherBatch) -> torch.Tensor:
        logits = self.module(input_ids=batch.ids).logits  # (B, T, V)
        return soft_cross_entropy(logits, batch.log_probs)

    @torch.no_grad()
    def draft_logits(self, batch: TeacherBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Its next-token logits and the target's log-probabilities at the same rows."""
        return self.module(input_ids=batch.ids).logits, batch.log_probs

    @torch.no_grad()
    def evaluate(self, batch: TeacherBatch) -> dict[str, float]:
        logits = self.module(input_ids=batch.ids).logits  # (B, T, V)
        return {"loss": next_token_loss(logits[:, :-1], batch.ids[:, 1:]).item(),
                "agreement": top1_agreement(logits, batch.log_probs)}
