"""Training a separate draft model (Leviathan et al. 2023; Chen et al. 2023) by distillation
from the target's next-token distributions: a Qwen3-architecture causal LM on the target's
vocabulary, so any target with any tokenizer can have one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

from specdec.training.losses import next_token_loss, soft_cross_entropy, top1_agreement
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
        for name in ("hidden", "layers", "heads", "kv_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"draft model {name} must be an int >= 1, got {value!r}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"draft model hidden ({self.hidden}) must divide by heads ({self.heads}) and heads "
                             f"by kv_heads ({self.kv_heads})")


def draft_config(size: DraftSize, target_config: Any, vocab_size: int) -> Qwen3Config:
    """A Qwen3 config of `size` for the target's vocabulary, special ids and context length."""
    positions = getattr(target_config, "max_position_embeddings", None) or getattr(target_config, "n_positions",
                                                                                   None) or 2048
    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=size.hidden, intermediate_size=size.intermediate or 3 * size.hidden,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.kv_heads,
        head_dim=size.hidden // size.heads, max_position_embeddings=int(positions), tie_word_embeddings=True,
        bos_token_id=getattr(target_config, "bos_token_id", None),
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
    def evaluate(self, batch: TeacherBatch) -> dict[str, float]:
        logits = self.module(input_ids=batch.ids).logits  # (B, T, V)
        return {"loss": next_token_loss(logits[:, :-1], batch.ids[:, 1:]).item(),
                "agreement": top1_agreement(logits, batch.log_probs)}
