"""Training a target from scratch: a transformers Qwen3-architecture causal LM, jointly with one
MTP module (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §2.2).

The loss is L_main + λ L_MTP, with λ = 0.3 for the first two thirds of the steps and 0.1
after, the schedule DeepSeek-V3 used. The MTP module reads the target's post-norm hidden state
and the next token's embedding, shares the target's embedding and LM head, and its gradient
flows into the target, as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from specdec.drafters.feature_heads.mtp_head import MtpHead
from specdec.training.data import WindowSampler
from specdec.training.losses import next_token_loss
from specdec.training.mtp import mtp_hidden
from specdec.training.optim import Steps, learning_rate, make_optimizer, progress, set_learning_rate
from specdec.training.shape import check_shape, qwen35_config, qwen3_config

__all__ = ["ARCHITECTURES", "TargetSize", "heldout_loss", "mtp_weight", "new_target", "target_config", "train_target"]


@dataclass(frozen=True)
class TargetSize:
    """The target's shape."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int | None = None  # default 3 * hidden
    max_positions: int = 2048
    architecture: str = "qwen3"  # or "qwen3_5": the hybrid layout (`specdec.training.shape.qwen35_config`)

    def __post_init__(self) -> None:
        check_shape("target", self, ("hidden", "layers", "heads", "kv_heads", "max_positions"))
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"target architecture must be one of {sorted(ARCHITECTURES)}, got {self.architecture!r}")


ARCHITECTURES = {"qwen3": (qwen3_config, "Qwen3ForCausalLM"), "qwen3_5": (qwen35_config, "Qwen3_5ForCausalLM")}


def target_config(size: TargetSize, vocab_size: int, eos_id: int) -> PretrainedConfig:
    """The config of `size` in its architecture (Qwen3, or Qwen3.5's hybrid layout with one MTP
    module), tied embeddings, `eos_id` as BOS, EOS and padding."""
    build, name = ARCHITECTURES[size.architecture]
    special = {"mtp_num_hidden_layers": 1} if size.architecture == "qwen3_5" else {}
    return build(size, vocab_size, size.max_positions, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
                 architectures=[name], **special)


def new_target(size: TargetSize, vocab_size: int, eos_id: int) -> PreTrainedModel:
    """A freshly initialised float32 target of `size` (`target_config`)."""
    return AutoModelForCausalLM.from_config(target_config(size, vocab_size, eos_id)).float()


def mtp_weight(step: int, steps: int, early: float = 0.3, late: float = 0.1) -> float:
    """λ: `early` for the first two thirds of training, `late` after."""
    return early if step < (2 * steps) // 3 else late


def _losses(model: PreTrainedModel, head: MtpHead, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(main next-token loss, MTP loss on the token after next) for ids [B, T]."""
    hidden = model.model(input_ids=ids).last_hidden_state  # (B, T, H), post-norm
    main = next_token_loss(model.lm_head(hidden[:, :-1]), ids[:, 1:])
    embeds = model.get_input_embeddings()(ids[:, 1:-1])  # x_{j+1} for j = 0..T-3
    positions = torch.arange(ids.shape[1] - 2, device=ids.device)
    extra = next_token_loss(model.lm_head(mtp_hidden(head, embeds, hidden[:, :-2], positions)), ids[:, 2:])
    return main, extra


def train_target(model: PreTrainedModel, head: MtpHead, data: torch.Tensor, settings: Steps,
                 show_progress: bool = True) -> dict[str, float]:
    """Train model and MTP module together on windows of `data` [N]; both end in eval mode."""
    model.train()
    head.train()
    sampler = WindowSampler(data, settings.seq_len, settings.seed)
    parameters = list(model.parameters()) + list(head.parameters())
    optimizer = make_optimizer(parameters, settings)
    last: dict[str, float] = {}
    bar = progress(settings.steps, "training target + MTP", show_progress)
    try:
        for step in range(settings.steps):
            set_learning_rate(optimizer, learning_rate(step, settings.steps, settings.lr, settings.warmup))
            main, extra = _losses(model, head, sampler(settings.batch))
            loss = main + mtp_weight(step, settings.steps) * extra
            if not torch.isfinite(loss):
                raise FloatingPointError(f"target: the loss became {loss.item()} at step {step}; lower the "
                                         f"learning rate (now {settings.lr})")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, settings.clip)
            optimizer.step()
            last = {"loss": main.item(), "mtp": extra.item()}
            bar.set_postfix({name: f"{value:.3f}" for name, value in last.items()}, refresh=False)
            bar.update(1)
    finally:
        bar.close()
        model.eval()
        head.eval()
    return last


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, windows: torch.Tensor, batch: int = 8) -> float:
    """Mean next-token cross-entropy (nats/token) of a causal LM over windows [n, T]."""
    total, count = 0.0, 0
    for start in range(0, windows.shape[0], batch):
        ids = windows[start : start + batch]
        logits = model(input_ids=ids).logits  # (b, T, V)
        total += next_token_loss(logits[:, :-1], ids[:, 1:]).item() * ids.shape[0]
        count += ids.shape[0]
    return total / count
