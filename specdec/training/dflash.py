"""Training a DFlash drafter (Chen et al. 2026, "DFlash: Block Diffusion for Flash Speculative
Decoding", arXiv 2602.06036: its training recipe, as SpecForge's trainer follows it).

The target stays frozen, its embedding and LM head too (the drafter reads them); the drafter's own
weights (fc, hidden_norm, the layers, norm) learn. In each training window of T tokens, up to
`anchors` (512) positions a are drawn among those where a whole block fits (1 <= a <= T - B). Each
forms the block [x_a, mask x (B - 1)] at positions a .. a + B - 1, whose queries see the context's
keys and values at positions strictly before a and their own block bidirectionally: at inference the
block starts at the last committed id, whose hidden states the target has not produced yet. The
context is the target's hidden states at the drafter's layers over the whole window, projected once
per window; all anchors of a window are the rows of one block forward over those same keys and
values (expanded, not copied), row r seeing the columns < a_r.

Slot j (1..B-1) learns the distribution of x_{a+j}. The loss is the one every specdec student
learns (self-distillation, `specdec.training.losses`): the cross-entropy from the target's own
distribution at that position (row a + j - 1 of its log-probabilities) to the slot's, which is
what the verifier accepts by, where the paper uses the text's token. Slot j is weighted by
w_j = exp(-(j - 1) / γ) (the paper's Eq. 4: a slot's draft counts only when every earlier one was
accepted) and the weighted sum is divided by Σ_j w_j.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import Qwen3Config

from specdec.drafters.parallel.dflash_files import ARCHITECTURE, default_layer_ids
from specdec.drafters.parallel.dflash_head import DFlashHead, DFlashSpec
from specdec.training.losses import next_token_loss, top1_agreement
from specdec.training.mask_token import check_mask_token, choose_mask_token
from specdec.training.shape import context_length
from specdec.training.teacher import TeacherBatch

__all__ = ["DFlashStudent", "anchor_blocks", "block_loss", "default_gamma", "dflash_layer_config", "position_weights",
           "sample_anchors", "training_layer_ids"]

DEPTHS_REPORTED = 4  # held-out figures for slots 1..4


def default_gamma(block_size: int) -> float:
    """γ of the weights for `block_size`: the recipe's 4, 5 and 7 for B = 8, 10 and 16, linear between
    them and along the nearest segment beyond (B / 2 up to 10, 5 + (B - 10) / 3 above), at least 1."""
    gamma = block_size / 2 if block_size <= 10 else 5 + (block_size - 10) / 3
    return max(1.0, gamma)


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """w_j = exp(-(j - 1) / γ) for slots j = 1 .. B - 1: float64 [B - 1]."""
    if not gamma > 0:
        raise ValueError(f"dflash: gamma must be positive, got {gamma!r}")
    slots = torch.arange(1, block_size, dtype=torch.float64)
    return torch.exp(-(slots - 1) / gamma)


def training_layer_ids(num_layers: int, draft_layers: int) -> tuple[int, ...]:
    """The target layers (0-based outputs) a new drafter fuses: the reference's default when those are
    distinct layers of 0 .. L - 2, else up to `draft_layers` ids spread evenly over 0 .. L - 2. Never
    L - 1: transformers gives its output after the final norm, vLLM and SGLang before it."""
    if num_layers < 2:
        raise ValueError(f"dflash: a target of {num_layers} layer(s) has no layer before its last to fuse; "
                         "train for a target of at least 2 layers")
    ids = default_layer_ids(num_layers, draft_layers)
    if len(set(ids)) == len(ids) and all(0 <= i <= num_layers - 2 for i in ids):
        return ids
    count, last = min(draft_layers, num_layers - 1), num_layers - 2
    if count == 1:
        return (last // 2,)
    return tuple(sorted({round(i * last / (count - 1)) for i in range(count)}))


def dflash_layer_config(target_config: Any, hidden: int, vocab: int, layers: int,
                        heads: int | None = None) -> Qwen3Config:
    """The Qwen3 config of `layers` draft layers shaped like the target's where it says how (heads,
    head size, MLP width, RoPE base, context length); `vocab` = the target's embedding rows. `heads`:
    that many attention heads, each with keys and values of its own (the target's head size), in
    place of the target's heads: the context reaches the block only through keys and values, so
    their width bounds what a slot reads of it."""
    own = heads is not None
    if own and (isinstance(heads, bool) or not isinstance(heads, int) or heads < 1):
        raise ValueError(f"dflash: heads must be a positive integer, got {heads!r}")
    target_heads = int(getattr(target_config, "num_attention_heads", 0) or max(1, hidden // 64))
    head_dim = int(getattr(target_config, "head_dim", 0) or hidden // target_heads)
    heads = heads if own else target_heads
    rope = getattr(target_config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") or (rope.get("full_attention") or {}).get("rope_theta") \
        or getattr(target_config, "rope_theta", None) or 10000.0
    return Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads if own else int(getattr(target_config, "num_key_value_heads", 0) or heads),
        head_dim=head_dim,
        intermediate_size=int(getattr(target_config, "intermediate_size", 0) or 3 * hidden),
        rms_norm_eps=float(getattr(target_config, "rms_norm_eps", 1e-6)),
        max_position_embeddings=context_length(target_config),
        rope_parameters={"rope_type": "default", "rope_theta": float(theta)}, attention_bias=False,
        tie_word_embeddings=False, architectures=[ARCHITECTURE], bos_token_id=None, eos_token_id=None,
        pad_token_id=None)


def sample_anchors(length: int, block_size: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """Up to `count` distinct anchors, uniform among 1 .. length - block_size, ascending: LongTensor [R]."""
    valid = length - block_size
    if valid < 1:
        raise ValueError(f"dflash: a window of {length} tokens holds no block of {block_size} after a context "
                         f"token; train on windows of at least {block_size + 1} tokens (--seq-len) or with a "
                         "smaller --block-size")
    return (torch.randperm(valid, generator=generator)[:count] + 1).sort().values


def anchor_blocks(head: DFlashHead, embed: nn.Module, features: torch.Tensor, ids: torch.Tensor,
                  anchors: torch.Tensor) -> torch.Tensor:
    """The final hidden states [R, B, H] of the blocks at `anchors` [R] of one sequence: ids [T],
    features [T, K * H] (the target's hidden states at the drafter's layers). Row r is the block
    [x_a, mask x (B - 1)] at positions a .. a + B - 1 (a = anchors[r]) and sees the context's keys
    and values at positions < a; the context is projected once, over the columns the last anchor
    sees, and every row reads the same tensors."""
    block = head.spec.block_size
    device = ids.device
    columns = int(anchors.max())
    positions = torch.arange(columns, device=device)
    context = head.context_kv(features[None, :columns], positions[None])  # [(1, kv_heads, C, D)] per layer
    rows = anchors.shape[0]
    keys = [k.expand(rows, -1, -1, -1) for k, _ in context]  # (R, kv_heads, C, D), no copy
    values = [v.expand(rows, -1, -1, -1) for _, v in context]
    visible = positions[None] < anchors[:, None]  # (R, C): strictly before the anchor
    block_ids = torch.full((rows, block), head.spec.mask_token_id, dtype=torch.long, device=device)
    block_ids[:, 0] = ids[anchors]
    with torch.no_grad():
        embeds = embed(block_ids)  # (R, B, H), the frozen target's rows
    return head.block(embeds, anchors[:, None] + torch.arange(block, device=device), keys, values, visible)


def block_loss(logits: torch.Tensor, teacher_log_probs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_j w_j CE(p_j, q_j) / Σ_j w_j, averaged over rows: logits, teacher_log_probs [R, B - 1, V],
    weights [B - 1] -> scalar."""
    wide = torch.promote_types(logits.dtype, torch.float32)
    log_q = F.log_softmax(logits.to(wide), dim=-1)
    cross = -(teacher_log_probs.to(wide).exp() * log_q).sum(-1)  # (R, B - 1)
    weights = weights.to(cross)
    return (cross * weights).sum(-1).mean() / weights.sum()


class DFlashStudent:
    """A DFlash stack learning the frozen target's distributions at every slot of its blocks."""

    name = "dflash"

    def __init__(self, head: DFlashHead, embed: nn.Module, lm_head: nn.Module, lr: float = 6e-4,
                 gamma: float | None = None, anchors: int = 512, seed: int = 0) -> None:
        if isinstance(anchors, bool) or not isinstance(anchors, int) or anchors < 1:
            raise ValueError(f"dflash: anchors per window must be a positive integer, got {anchors!r}")
        self.module: DFlashHead = head.train()
        self.embed, self.lm_head, self.lr, self.anchors = embed, lm_head, lr, anchors
        self.block_size = head.spec.block_size
        self.gamma = default_gamma(self.block_size) if gamma is None else float(gamma)
        self.weights = position_weights(self.block_size, self.gamma)  # (B - 1,)
        # layer ℓ's output is transformers' hidden_states[ℓ + 1]
        self.hidden_layers: tuple[int, ...] = tuple(i + 1 for i in head.spec.target_layer_ids)
        self._generator = torch.Generator().manual_seed(seed)

    @classmethod
    def create(cls, target: Any, seed: int, lr: float = 6e-4, *, tokenizer: Any = None,
               mask_token_id: int | None = None, block_size: int = 16, layers: int = 2,
               target_layer_ids: tuple[int, ...] | None = None, gamma: float | None = None,
               anchors: int = 512, heads: int | None = None) -> DFlashStudent:
        """A fresh drafter of `layers` draft layers for `target`, masking with `mask_token_id` (None: an
        id `tokenizer` never produces, `specdec.training.mask_token`); `heads` attention heads with
        keys and values of their own (None: the target's heads, `dflash_layer_config`)."""
        for option, value, least in (("block_size", block_size, 2), ("layers", layers, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"dflash: {option} must be an integer >= {least}, got {value!r}")
        config = target.config.get_text_config()
        embedding = target.get_input_embeddings().weight
        rows, hidden = (int(n) for n in embedding.shape)
        name = str(getattr(target, "name_or_path", "") or f"the {type(target).__name__} target")
        if mask_token_id is None:
            if tokenizer is None:
                raise ValueError("dflash: give the target's tokenizer (to find an id it never produces) or a "
                                 "mask_token_id")
            mask_token_id = choose_mask_token(tokenizer, rows, name)
        check_mask_token(mask_token_id, rows, name)
        num_layers = int(config.num_hidden_layers)
        ids = training_layer_ids(num_layers, layers) if target_layer_ids is None else tuple(target_layer_ids)
        if not ids or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers for i in ids):
            raise ValueError(f"dflash: target layer ids {ids} are not layers of {name} (0..{num_layers - 1})")
        torch.manual_seed(seed)
        layer = dflash_layer_config(config, hidden, rows, layers, heads)
        spec = DFlashSpec(layer, block_size, mask_token_id, ids, num_layers)
        head = DFlashHead(spec)
        with torch.no_grad():
            for parameter in head.parameters():
                if parameter.dim() == 2:
                    parameter.normal_(0.0, 0.02)
        head.to(device=embedding.device, dtype=embedding.dtype)
        rotary = head.rotary_emb  # its frequencies stay float32 whatever the head's dtype, as the drafter keeps them
        rotary.inv_freq = rotary.original_inv_freq.to(device=embedding.device, dtype=torch.float32)
        return cls(head, target.get_input_embeddings(), target.get_output_embeddings(), lr, gamma, anchors, seed)

    # -- the blocks of a batch ---------------------------------------------------------------------
    def _drawn(self, batch: TeacherBatch) -> list[torch.Tensor]:
        """Each window's random anchors, drawn for the step's global batch (the same whatever its split)."""
        rank, ranks = batch.part
        windows, length = batch.ids.shape
        drawn = [sample_anchors(length, self.block_size, self.anchors, self._generator) for _ in range(windows * ranks)]
        return drawn[rank * windows : (rank + 1) * windows]

    def _every(self, batch: TeacherBatch) -> list[torch.Tensor] | None:
        """Each window's anchors for held-out figures: every valid one (at most `anchors`, evenly
        spaced); None when the windows hold no block."""
        windows, length = batch.ids.shape
        valid = length - self.block_size
        if valid < 1:
            return None
        picked = torch.linspace(1, valid, min(valid, self.anchors), dtype=torch.float64).round().long().unique()
        return [picked] * windows

    def _blocks(self, batch: TeacherBatch, anchors: list[torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits [R, B - 1, V] of slots 1 .. B - 1 at every anchor of every window, the target's
        log-probabilities there [R, B - 1, V] and the text's tokens [R, B - 1]."""
        features = torch.cat([batch.layers[i] for i in self.hidden_layers], dim=-1)  # (W, T, K * H)
        device = batch.ids.device
        offsets = torch.arange(1, self.block_size, device=device)  # slots j = 1 .. B - 1
        logits, teacher, labels = [], [], []
        for window, picked in enumerate(anchors):
            picked = picked.to(device)
            hidden = anchor_blocks(self.module, self.embed, features[window], batch.ids[window], picked)  # (R, B, H)
            logits.append(self.lm_head(hidden[:, 1:]))
            where = picked[:, None] + offsets  # (R, B - 1): position a + j
            teacher.append(batch.log_probs[window, where - 1])  # row a + j - 1 predicts x_{a+j}
            labels.append(batch.ids[window, where])
        return torch.cat(logits), torch.cat(teacher), torch.cat(labels)

    # -- the Student protocol ----------------------------------------------------------------------
    def loss(self, batch: TeacherBatch) -> torch.Tensor:
        logits, teacher, _ = self._blocks(batch, self._drawn(batch))
        return block_loss(logits, teacher, self.weights)

    @torch.no_grad()
    def draft_logits(self, batch: TeacherBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Its logits at every slot of every held-out block and the target's log-probabilities there."""
        anchors = self._every(batch)
        if anchors is None:
            empty = batch.log_probs[:0, 0]
            return empty, empty
        logits, teacher, _ = self._blocks(batch, anchors)
        return logits.flatten(0, 1), teacher.flatten(0, 1)

    @torch.no_grad()
    def evaluate(self, batch: TeacherBatch) -> dict[str, float]:
        """`weighted` (the training loss over every anchor), and per slot d the text's cross-entropy
        (`loss`, `loss@d`) and top-1 agreement with the target (`agreement`, `agreement@d`)."""
        anchors = self._every(batch)
        if anchors is None:
            return {"weighted": math.nan, "loss": math.nan, "agreement": math.nan}
        logits, teacher, labels = self._blocks(batch, anchors)
        figures = {"weighted": block_loss(logits, teacher, self.weights).item()}
        for depth in range(1, min(DEPTHS_REPORTED, self.block_size - 1) + 1):
            suffix = "" if depth == 1 else f"@{depth}"
            slot = depth - 1
            figures["loss" + suffix] = next_token_loss(logits[:, slot], labels[:, slot]).item()
            figures["agreement" + suffix] = top1_agreement(logits[:, slot], teacher[:, slot])
        return figures
