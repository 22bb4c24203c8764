"""Training a draft model on a tokenizer of its own: a Qwen3 causal LM that learns the text itself
(plain next-token cross-entropy), for drafting across vocabularies (`specdec.drafters.draft_models.translation`).

The zoo's other draft model is distilled from the target (`specdec.training.draft_model`): at each
position it learns the target's distribution over the one vocabulary both share. Across
vocabularies there is no such target: the two tokenizers cut the same text at other places, so no
draft position has a target distribution over its own tokens to learn. This one is trained from
scratch as a language model on the training text encoded by its own tokenizer, as a small model of
another family would have been.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, Qwen3ForCausalLM

from specdec.training.data import WindowSampler
from specdec.training.draft_model import DraftSize
from specdec.training.losses import next_token_loss
from specdec.training.optim import Steps, learning_rate, make_optimizer, progress, set_learning_rate
from specdec.training.shape import qwen3_config

__all__ = ["new_language_model", "train_language_model"]


def new_language_model(size: DraftSize, vocab_size: int, positions: int, seed: int, bos_token_id: int | None,
                       eos_token_id: int | None, pad_token_id: int | None = None) -> PreTrainedModel:
    """A freshly initialised float32 Qwen3 causal LM of `size` (tied embeddings) on `vocab_size` ids."""
    torch.manual_seed(seed)
    config = qwen3_config(size, vocab_size, positions, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                          pad_token_id=pad_token_id, architectures=["Qwen3ForCausalLM"])
    return Qwen3ForCausalLM(config).float()


def train_language_model(model: PreTrainedModel, data: torch.Tensor, settings: Steps, show_progress: bool = True,
                         description: str = "training a language model") -> dict[str, float]:
    """Train `model` on random windows of `data` [N] (its own ids) by next-token cross-entropy for
    `settings.steps` AdamW steps; returns the last loss. The model ends in eval mode."""
    model.train()
    sampler = WindowSampler(data, settings.seq_len, settings.seed)
    optimizer = make_optimizer(model.parameters(), settings)
    last: dict[str, float] = {}
    bar = progress(settings.steps, description, show_progress)
    try:
        for step in range(settings.steps):
            set_learning_rate(optimizer, learning_rate(step, settings.steps, settings.lr, settings.warmup))
            ids = sampler(settings.batch)  # (B, T)
            logits = model(input_ids=ids[:, :-1]).logits  # (B, T - 1, V)
            loss = next_token_loss(logits, ids[:, 1:])
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{description}: the loss became {loss.item()} at step {step}; lower the "
                                         f"learning rate (now {settings.lr})")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.clip)
            optimizer.step()
            last = {"loss": loss.item()}
            bar.set_postfix({"loss": f"{last['loss']:.3f}"}, refresh=False)
            bar.update(1)
    finally:
        bar.close()
        model.eval()
    return last
