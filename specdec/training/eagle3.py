"""Training an EAGLE-3 head by training-time test (Li et al. 2025, "EAGLE-3", arXiv 2503.01840, §3.2).

The draft vocabulary is the `size` most frequent tokens of the training data. Each batch is
unrolled for `steps` (7) drafting steps on teacher-forced tokens: step 0 reads the pairs
(embed(x_{j+1}), fc(target states at j)) for every position j; step i reads (embed(x_{j+1+i}),
the head's own step-(i-1) output at j) and predicts x_{j+2+i}. Step i at j attends to the
step-0 entries at positions <= j and to its own chain's entries (steps 1..i at j), at rotary
positions j + i: exactly what the head sees when it drafts depth i + 1 after position j. The
loss is sum_i 0.8^i CE(target's distribution at j+1+i restricted to the draft vocabulary, the
head's); the target stays frozen, the head embeds with the target's embedding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from specdec.drafters.feature_heads.eagle3_head import SGLANG, Eagle3Head, Eagle3Spec, default_layers
from specdec.training.eagle import eagle_config
from specdec.training.losses import soft_cross_entropy
from specdec.training.teacher import TeacherBatch
from specdec.trees import additive_mask

__all__ = ["Eagle3Student", "draft_vocabulary", "training_layers", "unrolled_mask"]

DEPTHS_REPORTED = 4  # held-out figures per drafting depth 1..4


def draft_vocabulary(data: torch.Tensor, vocab_size: int, size: int) -> torch.Tensor:
    """The `size` most frequent ids of data [N] (ties: the lower id), ascending: LongTensor [size]."""
    if not 1 <= size <= vocab_size:
        raise ValueError(f"eagle3: the draft vocabulary must hold 1..{vocab_size} tokens, got {size}")
    counts = torch.bincount(data.flatten().long(), minlength=vocab_size)[:vocab_size]  # (V,)
    order = torch.sort(-counts, stable=True).indices  # most frequent first, lower ids first among ties
    return order[:size].sort().values


def training_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's default layers (2, L // 2, L - 3) where they are three ascending layers inside the
    residual stream 1..L-1 that serving engines capture; else three spread over 1..L-1 (first,
    middle, last); a target of fewer than 4 layers repeats layers."""
    low, high = 1, max(num_layers - 1, 1)
    default = default_layers(num_layers)
    if low <= default[0] < default[1] < default[2] <= high:
        return default
    return tuple(round(low + (high - low) * t) for t in (0.0, 0.5, 1.0))


def unrolled_mask(n: int, step: int, device: torch.device) -> torch.Tensor:
    """Which keys the queries of unrolled step `step` see: bool [n, (step + 1) * n]; block 0 is the
    step-0 entries (causal), block b >= 1 step b's entries (the same position only)."""
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    same = torch.eye(n, dtype=torch.bool, device=device)
    return torch.cat([causal] + [same] * step, dim=1)


class Eagle3Student:
    """An EAGLE-3 head learning the frozen target's distributions over `steps` unrolled drafts."""

    name = "eagle3"

    def __init__(self, head: Eagle3Head, embed: nn.Module, lr: float = 1e-3, steps: int = 7,
                 decay: float = 0.8) -> None:
        if steps < 1:
            raise ValueError(f"eagle3: training-time test needs at least one step, got {steps}")
        self.module: Eagle3Head = head.train()
        self.embed, self.lr, self.steps, self.decay = embed, lr, steps, decay
        if head.spec.layers is None:
            raise ValueError("eagle3: a head in training names its layers (Eagle3Spec.layers)")
        self.hidden_layers: tuple[int, ...] = head.spec.layers
        self._ids = head.target_ids()  # (V_draft,) the draft vocabulary's target ids

    @classmethod
    def create(cls, target: Any, data: torch.Tensor, seed: int, lr: float = 1e-3, draft_vocab: int | None = None,
               layers: tuple[int, ...] | None = None, steps: int = 7, norm_before_residual: bool = True
               ) -> Eagle3Student:
        """A head for `target` whose draft vocabulary comes from token frequencies in `data` [N].

        norm_before_residual: the layer's residual starts from hidden_norm(g), as speculators
        trains heads; from the unnormed g (SafeAILab's layout) the residual stream's large entries
        reach the output unnormed, and a head learns far slower (`docs/drafters.md`)."""
        lm_head = target.get_output_embeddings()
        vocab, hidden = (int(n) for n in lm_head.weight.shape)
        config = target.config.get_text_config()
        num_layers = int(config.num_hidden_layers)
        layers = layers or training_layers(num_layers)
        if any(not 0 <= i <= num_layers for i in layers):
            raise ValueError(f"eagle3: layers {tuple(layers)} do not exist in a target of {num_layers} layers "
                             f"(hidden_states indices 0..{num_layers})")
        size = min(vocab, 32000) if draft_vocab is None else draft_vocab
        ids = draft_vocabulary(data, vocab, size)
        torch.manual_seed(seed)
        spec = Eagle3Spec(eagle_config(config, hidden, vocab), size, hidden, tuple(layers), norm_before_residual,
                          SGLANG)
        head = Eagle3Head(spec)
        with torch.no_grad():
            for name, parameter in head.named_parameters():
                if parameter.dim() == 2:
                    parameter.normal_(0.0, 0.02)
            head.lm_head.weight.copy_(lm_head.weight[ids])  # start from the target's own rows
            head.d2t.copy_(ids - torch.arange(size))
            head.t2d[ids] = True
        return cls(head, target.get_input_embeddings(), lr, steps)

    def _fused(self, batch: TeacherBatch) -> torch.Tensor:
        return torch.cat([batch.layers[i] for i in self.hidden_layers], dim=-1)  # (B, T, m·H)

    def _unroll(self, batch: TeacherBatch, steps: int) -> list[torch.Tensor]:
        """Draft-vocabulary logits [B, T-1-i, V_draft] of unrolled steps i = 0..steps-1 (valid positions)."""
        ids = batch.ids
        n = ids.shape[1] - 1  # pairs j = 0..T-2
        cache = DynamicCache(config=self.module.config)
        feeds = self._fused(batch)[:, :-1]  # (B, n, m·H)
        out: list[torch.Tensor] = []
        for i in range(min(steps, n)):
            tokens = ids[:, 1 + i :]  # x_{j+1+i}, valid for j < n - i
            tokens = torch.cat([tokens, tokens[:, -1:].expand(-1, i)], dim=1)  # (B, n): padding, never seen
            with torch.no_grad():
                embeds = self.embed(tokens)
            mask = additive_mask(unrolled_mask(n, i, ids.device), feeds.dtype)  # (1, 1, n, (i+1) n)
            feeds = self.module(embeds, feeds, torch.arange(n, device=ids.device) + i, cache, mask)  # (B, n, H)
            out.append(self.module.draft_logits(feeds[:, : n - i]))
        return out

    def _restricted(self, batch: TeacherBatch, step: int) -> torch.Tensor:
        """The target's log-probabilities for step `step`'s positions, over the draft vocabulary."""
        rows = batch.log_probs[:, 1 + step :, self._ids.to(batch.ids.device)]  # (B, T-1-step, V_draft)
        return rows - rows.logsumexp(-1, keepdim=True)

    def loss(self, batch: TeacherBatch) -> torch.Tensor:
        total = torch.zeros((), device=batch.ids.device)
        for i, logits in enumerate(self._unroll(batch, self.steps)):
            total = total + self.decay**i * soft_cross_entropy(logits, self._restricted(batch, i))
        return total

    @torch.no_grad()
    def draft_logits(self, batch: TeacherBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits for the first drafted token and the target's log-probabilities over the draft
        vocabulary, at positions where the target's choice lies inside it."""
        logits = self._unroll(batch, 1)[0]  # (B, T-1, V_draft)
        teacher = batch.log_probs[:, 1:]
        inside = self.module.t2d[teacher.argmax(-1)]  # (B, T-1)
        return logits[inside], self._restricted(batch, 0)[inside]

    @torch.no_grad()
    def evaluate(self, batch: TeacherBatch) -> dict[str, float]:
        ids = self._ids.to(batch.ids.device)
        figures: dict[str, float] = {}
        for i, logits in enumerate(self._unroll(batch, DEPTHS_REPORTED)):
            chosen = ids[logits.argmax(-1)]  # (B, n - i) target ids
            agreement = (chosen == batch.log_probs[:, 1 + i :].argmax(-1)).float().mean().item()
            figures["agreement" if i == 0 else f"agreement@{i + 1}"] = agreement
            if i == 0:
                labels = batch.ids[:, 2:].contiguous()  # the text's x_{j+2}
                inside = self.module.t2d[labels]
                draft_labels = torch.searchsorted(ids, labels)  # the draft id of each label inside
                log_q = torch.log_softmax(logits[:, : labels.shape[1]].float(), -1)
                picked = log_q.gather(-1, draft_labels.clamp(max=ids.shape[0] - 1)[..., None])[..., 0]
                figures["loss"] = (-picked[inside]).mean().item() if inside.any() else float("nan")
                figures["coverage"] = inside.float().mean().item()  # text tokens inside the draft vocabulary
        return figures
