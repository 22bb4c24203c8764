"""Training an MTP module (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §2.2) and writing it
into a target checkpoint in the Qwen3-Next `mtp.*` layout that `specdec.drafters.feature_heads.mtp` reads.

At position j the module reads (embed(x_{j+1}), h_j) and predicts x_{j+2}. Jointly with the
target (`specdec.training.target`) it learns the text; after the fact, on a frozen target, it
learns the target's distribution at j+1 (self-distillation).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec.drafters.feature_heads.mtp_files import mtp_checkpoint_keys
from specdec.drafters.feature_heads.mtp_head import MtpHead
from specdec.staging import staged, write_json
from specdec.training.eagle import feature_pairs
from specdec.training.losses import next_token_loss, soft_cross_entropy, top1_agreement
from specdec.training.teacher import TeacherBatch

__all__ = ["MtpStudent", "create_mtp_head", "mtp_hidden", "write_mtp"]

SAFETENSORS = "model.safetensors"
INDEX = "model.safetensors.index.json"
MTP_SHARD = "model-mtp.safetensors"


def create_mtp_head(config: Any, seed: int) -> MtpHead:
    """One Qwen-layout MTP module for a target with `config`, initialised like transformers' layers."""
    torch.manual_seed(seed)
    head = MtpHead(config, "qwen", 1)
    std = float(getattr(config, "initializer_range", 0.02))
    with torch.no_grad():
        for parameter in head.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, std)
    return head


def mtp_hidden(head: MtpHead, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The LM-head inputs [B, n, H] of the module's first stage for pairs (embeds, features) [B, n, H]."""
    return head(0, embeds, features, positions)[1]


class MtpStudent:
    """An MTP module learning the frozen target's distribution one token further ahead."""

    name = "mtp"

    def __init__(self, head: MtpHead, embed: nn.Module, lm_head: nn.Module, lr: float = 1e-3) -> None:
        self.module: MtpHead = head.train()
        self.embed, self.lm_head, self.lr = embed, lm_head, lr

    @classmethod
    def create(cls, target: Any, seed: int, lr: float = 1e-3) -> MtpStudent:
        head = create_mtp_head(target.config.get_text_config(), seed)
        return cls(head, target.get_input_embeddings(), target.get_output_embeddings(), lr)

    def _logits(self, batch: TeacherBatch) -> torch.Tensor:
        return self.lm_head(mtp_hidden(self.module, *feature_pairs(self.embed, batch)))  # (B, T-1, V)

    def loss(self, batch: TeacherBatch) -> torch.Tensor:
        return soft_cross_entropy(self._logits(batch), batch.log_probs[:, 1:])

    @torch.no_grad()
    def draft_logits(self, batch: TeacherBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Its logits for the first drafted token and the target's log-probabilities there."""
        return self._logits(batch), batch.log_probs[:, 1:]

    @torch.no_grad()
    def evaluate(self, batch: TeacherBatch) -> dict[str, float]:
        logits = self._logits(batch)
        return {"loss": next_token_loss(logits[:, :-1], batch.ids[:, 2:]).item(),
                "agreement": top1_agreement(logits, batch.log_probs[:, 1:])}


def write_mtp(head: MtpHead, target: str | Path, out: str | Path) -> Path:
    """Write a copy of the checkpoint in `target` with the module's tensors (`mtp.*`) added into
    the new directory `out` (absent or empty), all or nothing; returns `out`.

    The copy is written into a staging directory beside `out` and renamed onto it once it is
    whole (`specdec.staging`), so a failure leaves neither `out` nor a partial copy, and `target`
    is only read. A single `model.safetensors` is rewritten with the module's tensors; a sharded
    checkpoint gets one more shard, `model-mtp.safetensors`, and its index names it. `mtp.*`
    tensors `target` already holds are replaced, never duplicated.
    """
    target, out = Path(target), Path(out)
    if head.layout != "qwen":
        raise ValueError(f"write_mtp writes the qwen layout, got a {head.layout!r} module")
    if not (target / INDEX).is_file() and not (target / SAFETENSORS).is_file():
        raise FileNotFoundError(f"{target} holds neither {SAFETENSORS} nor {INDEX}; save the target first")
    with staged(out) as staging:
        shutil.copytree(target, staging, dirs_exist_ok=True)
        _add_mtp(head, staging)
    return out


def _add_mtp(head: MtpHead, directory: Path) -> None:
    """Put the module's tensors and layer count into the checkpoint in `directory`, in place."""
    from safetensors.torch import load_file, save_file

    stored = {key: tensor.detach().cpu().contiguous() for key, tensor in head.state_dict().items()}
    tensors = {mtp_checkpoint_keys(head)[key]: tensor for key, tensor in stored.items()}
    index, single = directory / INDEX, directory / SAFETENSORS
    if index.is_file():
        save_file(tensors, str(directory / MTP_SHARD), metadata={"format": "pt"})
        table = json.loads(index.read_text())
        table["weight_map"] = {k: v for k, v in table["weight_map"].items() if not k.startswith("mtp.")}
        table["weight_map"].update({key: MTP_SHARD for key in tensors})
        write_json(index, table)
    else:
        model = {k: v for k, v in load_file(str(single)).items() if not k.startswith("mtp.")}
        save_file({**model, **tensors}, str(single), metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    config["mtp_num_hidden_layers"] = len(head.stages[0].layers)  # type: ignore[index, arg-type]
    write_json(directory / "config.json", config)
