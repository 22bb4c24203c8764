"""Training a PARD draft model (An et al. 2025, "PARD: Accelerating LLM Inference with Low-Cost
PARallel Draft Model Adaptation", arXiv 2504.18583; the recipe as AMD's `pard_train.py` builds it).

A causal LM (the draft model `specdec train draft-model` builds, or an existing small model) learns
to draft k tokens in one forward over [committed ids, mask x (k - 1)]. Each window of T ids is laid
out as P = para_num blocks: block 0 is the window, block i (1..P-1) the mask id at every index t,
at position t. Query (block i, index t) stands for the i-th mask after the real prefix x_0..x_p,
p = t - i: it sees the real ids at indices 0..p and its own chain of masks (block m, index p + m),
m = 1..i, exactly what mask i sees at inference, and it learns the token i + 1 past x_p, x_{t+1}.
Block 0 is the ordinary next-token model. Only t >= i has a prefix.

Conditional drop (COD): block i keeps max(r^i, r_min) of the T indices (r = 0.7, r_min = 0.2: about
3.4 T rows for P = 8 instead of 8 T), drawn among the successors of the indices block i - 1 kept, so
every kept mask's chain is kept whole. PARD wraps the successor of index T - 1 round to 0, a row
without a prefix and without a loss; here it is not drawn, and block i keeps at most one row fewer
than block i - 1, so every window of a batch keeps the same number of rows.

The loss is the one every specdec student learns (self-distillation, `specdec.training.losses`):
the cross-entropy from the target's own distribution at index t (its log-probabilities for x_{t+1}
given x_0..x_t) to row (i, t)'s, every row weighted alike, where PARD uses the text's x_{t+1}.

The mask id is one the tokenizer never produces (`specdec.training.mask_token`: a named mask token,
a padding row past the tokenizer's ids, or a byte UTF-8 never holds); when the table has none, the
draft model gets one more row for it, which the drafter never drafts. The checkpoint is a plain
causal LM whose config.json carries `pard_token` and `spd_type: "pard"`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from specdec.checkpoints import load_causal_lm, quiet_transformers
from specdec.training.draft_model import DraftModelStudent, DraftSize
from specdec.training.losses import next_token_loss, soft_cross_entropy, top1_agreement
from specdec.training.mask_token import choose_mask_token
from specdec.training.teacher import TeacherBatch
from specdec.trees import additive_mask

__all__ = ["PardRecipe", "PardStudent", "chain_visible", "drop_tokens", "kept_counts", "save_pard", "whole_layout"]

DEPTHS_REPORTED = 4  # held-out figures for mask offsets 0..3 (drafting depths 1..4)


@dataclass(frozen=True)
class PardRecipe:
    """The parallel layout of a training window."""

    para_num: int = 8  # P: blocks, block i trains drafting depth i + 1
    ratio: float = 0.7  # COD: block i keeps max(ratio^i, floor) of the indices
    floor: float = 0.2

    def __post_init__(self) -> None:
        if isinstance(self.para_num, bool) or not isinstance(self.para_num, int) or self.para_num < 1:
            raise ValueError(f"pard: para_num must be an int >= 1, got {self.para_num!r}")
        for name in ("ratio", "floor"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"pard: {name} must lie in (0, 1], got {value!r}")


def kept_counts(length: int, recipe: PardRecipe) -> list[int]:
    """Rows each block keeps in a window of `length` ids: all of block 0, then
    int(length * max(ratio^i, floor)), at most one fewer than the block before."""
    counts = [length]
    for i in range(1, recipe.para_num):
        share = int(length * max(recipe.ratio**i, recipe.floor))
        counts.append(max(0, min(share, counts[-1] - 1)))
    return counts


def drop_tokens(length: int, recipe: PardRecipe, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One window's kept rows (COD): their blocks [N] and indices [N], block by block, indices ascending."""
    blocks, indices = [torch.zeros(length, dtype=torch.long)], [torch.arange(length)]
    for i, count in enumerate(kept_counts(length, recipe)[1:], start=1):
        successors = indices[-1] + 1
        successors = successors[successors < length]  # (>= count,) rows whose chain block i - 1 kept
        chosen = successors[torch.randperm(successors.shape[0], generator=generator)[:count]].sort().values
        blocks.append(torch.full((count,), i, dtype=torch.long))
        indices.append(chosen)
    return torch.cat(blocks), torch.cat(indices)


def whole_layout(length: int, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row (i, t) with t >= i of the first `blocks` blocks, no drop: blocks [N] and indices [N]."""
    pairs = [(i, t) for i in range(min(blocks, length)) for t in range(i, length)]
    block, index = torch.tensor(pairs, dtype=torch.long).T
    return block, index


def chain_visible(blocks: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Which rows each row sees, [..., N, N] for blocks, indices [..., N]: query (i, t) sees (0, s)
    for s <= t - i and (m, t - i + m) for m = 1..i (itself included)."""
    query_block, query_index = blocks[..., :, None], indices[..., :, None]  # (..., N, 1)
    key_block, key_index = blocks[..., None, :], indices[..., None, :]  # (..., 1, N)
    prefix = query_index - query_block  # (..., N, 1) p, the last real index the query sees
    real = (key_block == 0) & (key_index <= prefix)
    chain = (key_block >= 1) & (key_block <= query_block) & (key_index == prefix + key_block)
    return real | chain


class PardStudent:
    """A draft model learning, at each mask offset, the target's distribution that far ahead."""

    name = "pard"

    def __init__(self, model: PreTrainedModel, mask: int, vocab: int, recipe: PardRecipe, lr: float = 2e-3,
                 seed: int = 0) -> None:
        """vocab: the target's V; the model may have one row more (the mask's), left out of its logits."""
        self.module: PreTrainedModel = model.train()
        self.mask, self.vocab, self.recipe, self.lr = mask, vocab, recipe, lr
        self.generator = torch.Generator().manual_seed(seed)  # the drop's draws

    @classmethod
    def create(cls, size: DraftSize, target: PreTrainedModel, tokenizer: Any, seed: int, lr: float = 2e-3,
               from_target: bool = False, init: str | Path | None = None,
               recipe: PardRecipe | None = None) -> PardStudent:
        """A PARD student for `target`: from a fresh draft model of `size` (as `DraftModelStudent`),
        or from the causal LM at `init`, which must share the target's tokenizer."""
        vocab = int(target.get_output_embeddings().weight.shape[0])
        if init is None:
            model = DraftModelStudent.create(size, target, seed, lr, from_target=from_target).module
        else:
            model = _initial_model(init, vocab)
        mask = getattr(model.config, "pard_token", None)
        if not isinstance(mask, int) or mask < 0:
            mask = _free_row(model, tokenizer, vocab)
        return cls(model, mask, vocab, recipe or PardRecipe(), lr, seed)

    def loss(self, batch: TeacherBatch) -> torch.Tensor:
        ids = batch.ids  # (B, T)
        windows, length = ids.shape
        rank, ranks = batch.part  # draw for the global batch, keep this process's share
        drawn = [drop_tokens(length, self.recipe, self.generator) for _ in range(windows * ranks)]
        mine = drawn[rank * windows : (rank + 1) * windows]
        blocks = torch.stack([b for b, _ in mine]).to(ids.device)  # (B, N)
        indices = torch.stack([t for _, t in mine]).to(ids.device)  # (B, N)
        logits = self._logits(ids, blocks, indices)  # (B, N, V)
        rows = torch.arange(windows, device=ids.device)[:, None]
        return soft_cross_entropy(logits, batch.log_probs[rows, indices])

    @torch.no_grad()
    def evaluate(self, batch: TeacherBatch) -> dict[str, float]:
        ids = batch.ids  # (B, T)
        windows, length = ids.shape
        block, index = whole_layout(length, min(DEPTHS_REPORTED, self.recipe.para_num))
        logits = self._logits(ids, block.expand(windows, -1).to(ids.device), index.expand(windows, -1).to(ids.device))
        figures: dict[str, float] = {}
        for i in range(int(block.max()) + 1):
            rows = logits[:, (block == i).to(ids.device)]  # (B, T - i, V): indices i .. T - 1
            suffix = "" if i == 0 else f"@{i + 1}"
            figures[f"agreement{suffix}"] = top1_agreement(rows, batch.log_probs[:, i:])
            if length - i > 1:
                figures[f"loss{suffix}"] = next_token_loss(rows[:, :-1], ids[:, i + 1 :]).item()
        return figures

    def _logits(self, ids: torch.Tensor, blocks: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The model's logits over the target's V at rows (blocks, indices) [B, N] of windows ids [B, T]: (B, N, V)."""
        inputs = torch.where(blocks == 0, ids.gather(1, indices), self.mask)  # (B, N)
        dtype = self.module.get_input_embeddings().weight.dtype
        mask = additive_mask(chain_visible(blocks, indices), dtype)[0, 0][:, None]  # (B, 1, N, N)
        out = self.module(input_ids=inputs, attention_mask=mask, position_ids=indices).logits  # (B, N, V')
        return out[..., : self.vocab]


def _initial_model(init: str | Path, vocab: int) -> PreTrainedModel:
    """The causal LM at `init`, in float32 and training mode, when it has the target's V output rows
    (or one more, a PARD checkpoint's mask row)."""
    model = load_causal_lm(init).float()
    rows = int(model.get_output_embeddings().weight.shape[0])
    mask = getattr(model.config, "pard_token", None)
    if rows != vocab and not (rows == vocab + 1 and mask == vocab):
        raise ValueError(f"pard: --init {str(init)!r} has {rows} output rows, the target {vocab}; PARD drafts on the "
                         "target's vocabulary, so start from a model with the target's tokenizer and vocabulary")
    return model


def _free_row(model: PreTrainedModel, tokenizer: Any, vocab: int) -> int:
    """A row the tokenizer never produces (`choose_mask_token`), else a new last row of the model's
    embeddings (and, tied or not, its LM head), left out of its logits."""
    rows = int(model.get_input_embeddings().weight.shape[0])
    try:
        return choose_mask_token(tokenizer, min(rows, vocab), "the target")
    except ValueError:
        with quiet_transformers():
            model.resize_token_embeddings(vocab + 1, mean_resizing=True)
        return vocab


def save_pard(student: PardStudent, tokenizer: Any, out: Path) -> dict[str, Any]:
    """Write the student as a causal LM directory with `pard_token` and `spd_type` in its config
    (and the tokenizer); returns the make_drafter options that load it."""
    config = student.module.config
    config.pard_token = student.mask
    config.spd_type = "pard"
    with quiet_transformers():
        student.module.save_pretrained(out)
    tokenizer.save_pretrained(str(out))
    return {"model": str(out)}
