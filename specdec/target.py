"""Adapter over a transformers causal LM: one KV cache, forwards that keep only the logits
asked for, the hidden states drafters read, and exact rollback to a prefix.

The same adapter serves the target and any drafter that runs a causal LM of its own. Hybrid
models (Qwen3-Next: GatedDeltaNet linear attention beside full attention) hold recurrent
state that cannot be cropped: each forward first snapshots it and keeps the ids it feeds, and
a rollback restores the latest snapshot at or before the new length, then replays the ids
from there to that length in one forward (none when the snapshot is exactly there).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

from specdec.cache import (Snapshot, cache_length, check_transformers, crop_cache, has_recurrent_state, new_cache,
                           restore, snapshot, uncroppable_layers)

__all__ = ["CausalLM"]

_FINAL_NORM_PATHS = ("model.norm", "transformer.ln_f", "model.final_layernorm", "gpt_neox.final_layer_norm",
                     "model.decoder.final_layer_norm")


class CausalLM:
    """One causal LM and its KV cache, batch size 1.

    Invariant kept by the decode loop: the cache holds every committed token but the last.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        if not isinstance(model, PreTrainedModel) or model.get_output_embeddings() is None:
            raise TypeError(
                f"expected a transformers causal LM (e.g. from AutoModelForCausalLM), got "
                f"{type(model).__name__}"
            )
        check_transformers()
        if model.training:
            raise ValueError(f"{type(model).__name__} is in training mode (dropout would make decoding "
                             "random); call model.eval() first")
        unsupported = uncroppable_layers(model)
        if unsupported:
            raise ValueError(
                f"{type(model).__name__} has {', '.join(unsupported)} layers whose state cannot be "
                "rolled back to a prefix; specdec serves attention and linear-attention layers"
            )
        self.model = model
        self.config = model.config.get_text_config()
        self.vocab_size: int = int(model.get_output_embeddings().weight.shape[0])
        self.device: torch.device = model.get_output_embeddings().weight.device
        self.dtype: torch.dtype = model.get_output_embeddings().weight.dtype
        positions = getattr(self.config, "max_position_embeddings", None) or getattr(
            self.config, "n_positions", None
        )
        self.max_positions: int | None = int(positions) if positions else None
        # Rotary models run past max_position_embeddings (degrading); learned tables cannot.
        self.learned_positions: bool = not any(
            getattr(self.config, name, None) for name in ("rope_parameters", "rope_theta", "rope_scaling")
        )
        self.hidden_size: int = int(model.get_output_embeddings().weight.shape[1])
        self.cache: Cache | None = None
        self._recurrent = False  # whether rollback needs snapshots (hybrid model)
        self._snapshots: list[tuple[Snapshot, torch.Tensor]] = []  # (state before a forward, ids it fed)

    @property
    def embed_tokens(self) -> nn.Module:
        """The input embedding (token ids -> [.., H])."""
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        """The output projection ([.., H] -> logits [.., V])."""
        return self.model.get_output_embeddings()

    @property
    def final_norm(self) -> nn.Module | None:
        """The norm applied before the LM head, when the architecture has a known one."""
        for path in _FINAL_NORM_PATHS:
            module: object = self.model
            for part in path.split("."):
                module = getattr(module, part, None)
            if isinstance(module, nn.Module):
                return module
        return None

    @property
    def cache_length(self) -> int:
        """Positions held by the KV cache."""
        return cache_length(self.cache)

    def reset(self) -> None:
        """Drop the cache; the next forward starts at position 0."""
        self.cache = new_cache(self.model)
        self._recurrent = has_recurrent_state(self.cache)
        self._snapshots = []

    def forward(
        self, input_ids: torch.Tensor, keep: int, hidden: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run input_ids [n] after the cached prefix and append them to the cache.

        Returns logits [keep, V] of the last `keep` positions and, if `hidden`, the last-layer
        post-norm hidden states [n, H].
        """
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (rows of logits to return), got {keep}")
        if self.cache is None:
            self.reset()
        assert self.cache is not None
        if self._recurrent:  # ids are cloned: callers reuse their buffers
            self._snapshots.append((snapshot(self.cache), input_ids.clone()))
        return self._run(input_ids, keep, hidden)

    def _run(self, input_ids: torch.Tensor, keep: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.model(
            input_ids=input_ids.unsqueeze(0),  # (1, n)
            cache=self.cache,
            use_cache=True,
            logits_to_keep=keep,
            output_hidden_states=hidden,
        )
        logits = out.logits[0]  # (keep, V)
        states = out.hidden_states[-1][0] if hidden else None  # (n, H)
        return logits, states

    def rollback(self, length: int) -> None:
        """Keep the first `length` cached positions, exactly.

        Hybrid models can go back to any position since the last rollback or reset.
        """
        if self.cache is None:
            self.reset()
        assert self.cache is not None
        current = self.cache_length
        if not self._recurrent or length == current:
            crop_cache(self.cache, length)
        else:
            self._restore_and_replay(length, current)
        self._snapshots = []

    def _restore_and_replay(self, length: int, current: int) -> None:
        starts = [saved.length for saved, _ in self._snapshots]
        if not 0 <= length <= current or not starts or length < starts[0]:
            raise ValueError(f"cannot roll back a cache of {current} positions to {length}: a hybrid model "
                             f"rolls back only to positions {starts[0] if starts else current}..{current} "
                             "fed since the last rollback or reset")
        index = max(i for i, start in enumerate(starts) if start <= length)
        saved = self._snapshots[index][0]
        assert self.cache is not None
        restore(self.cache, saved)
        if length > saved.length:
            fed = torch.cat([ids for _, ids in self._snapshots[index:]])  # ids from saved.length on
            self._run(fed[: length - saved.length], keep=1, hidden=False)  # under the caller's grad mode
