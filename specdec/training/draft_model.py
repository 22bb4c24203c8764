"""Training a separate draft model (Leviathan et al. 2023; Chen et al. 2023) by distillation
from the target's next-token distributions: a Qwen3-architecture causal LM on the target's
vocabulary, so any target with any tokenizer can have one.

Its (tied) embeddings may start from the target's, as a distilled student starts from its
teacher's weights (Sanh et al. 2019, "DistilBERT", §3): a draft model as wide as the target takes
them as they are, a narrower one their projection onto the `hidden` principal directions of the
target's embedding rows, which keeps as much of their geometry as `hidden` dimensions can."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

from specdec.training.losses import next_token_loss, soft_cross_entropy, top1_agreement
from specdec.training.shape import check_shape, context_length, qwen3_config
from specdec.training.teacher import TeacherBatch

__all__ = ["DraftModelStudent", "DraftSize", "draft_config", "projected_embeddings"]


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


def projected_embeddings(weight: torch.Tensor, hidden: int) -> torch.Tensor:
    """The rows of an embedding matrix weight [V, H] in `hidden` <= H dimensions: weight itself when
    hidden == H, else weight @ P [V, hidden] for P the top-`hidden` eigenvectors of weight^T weight,
    the directions along which the rows spread most."""
    vocab, width = weight.shape
    if not 1 <= hidden <= width:
        raise ValueError(f"a draft model {hidden} wide cannot start from embeddings {width} wide; "
                         f"give a hidden size of 1..{width}, or start it at random")
    rows = weight.detach().double()
    if hidden == width:
        return rows.to(weight.dtype).clone()
    _, vectors = torch.linalg.eigh(rows.T @ rows)  # ascending eigenvalues, (H, H)
    return (rows @ vectors[:, -hidden:].flip(-1)).to(weight.dtype)  # (V, hidden), largest direction first


class DraftModelStudent:
    """A draft model learning the target's next-token distribution at every position."""

    name = "draft-model"

    def __init__(self, model: PreTrainedModel, lr: float = 2e-3) -> None:
        self.module: PreTrainedModel = model.train()
        self.lr = lr

    @classmethod
    def create(cls, size: DraftSize, target: PreTrainedModel, seed: int, lr: float = 2e-3,
               from_target: bool = False) -> DraftModelStudent:
        """A fresh draft model of `size`; `from_target`: its embeddings start from the target's
        input embeddings (`projected_embeddings`), the rest at random."""
        torch.manual_seed(seed)
        vocab = int(target.get_output_embeddings().weight.shape[0])
        model = Qwen3ForCausalLM(draft_config(size, target.config.get_text_config(), vocab))
        if from_target:
            source = target.get_input_embeddings().weight  # (V', H) V' >= vocab where the table is padded
            with torch.no_grad():
                model.get_input_embeddings().weight.copy_(projected_embeddings(source[:vocab], size.hidden))
        return cls(model, lr)

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
