"""EAGLE-3: drafting from a fusion of the target's low, middle and high layers (Li et al. 2025,
"EAGLE-3", arXiv 2503.01840); the head and its checkpoints are `specdec.drafters.feature_heads.eagle3_head`.

At position j the head reads the pair (embed(x_{j+1}), g_j), g_j = fc(cat of the target's
hidden states at j in three layers), and its output at j gives the logits of x_{j+2} over the
draft vocabulary. Drafting feeds each output back in place of g: (d_1, out_{T-2}) -> out -> d_2.
Sampled drafts report q over the whole target vocabulary, zero outside the draft vocabulary.

The state invariant is EAGLE-1's (`specdec.drafters.feature_heads.eagle`): the head's cache holds one entry
per real pair; drafted entries are rolled back at commit and the accepted positions return as
real pairs with their hidden states at the next propose.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from torch import nn

from specdec.drafters.feature_heads.eagle3_files import load_eagle3
from specdec.drafters.feature_heads.eagle3_head import Eagle3Head, TargetVocab, default_layers
from specdec.drafters.feature_heads.feature_batch import FeatureBatch, FeatureParts, pair_forward
from specdec.drafters.feature_heads.feature_drafts import (chain_draft, draft_entries, fed_chain_draft, sampled_tree_draft,
                                             shallower_tree, topk_tree_draft)
from specdec.drafters.feature_heads.feature_pairs import PREFILL_HOLD, feed_pending
from specdec.drafters.feature_heads.head_steps import HeadSteps
from specdec.drafters.shared.forms import DraftsThroughForms, Forms
from specdec.drafters.tree_search.dynamic import tree_settings
from specdec.protocols import Capability, DraftContext
from specdec.runtime.target import CausalLM
from specdec.types import Draft

__all__ = ["Eagle3Drafter", "Eagle3Row", "check_fits", "layers_for"]


def layers_for(head: Eagle3Head, lm: CausalLM) -> tuple[int, ...]:
    """The target layers the head reads: its checkpoint's, else EAGLE-3's default for the target;
    raises naming the config when they do not exist in the target."""
    layers = head.spec.layers or default_layers(lm.num_layers)
    if any(not 0 <= i <= lm.num_layers for i in layers):
        said = "its config's layer ids" if head.spec.layers else f"the default (2, L // 2, L - 3) = {layers}"
        raise ValueError(f"eagle3: {head.files[0]}: {said} name hidden states {layers} but the target has "
                         f"{lm.num_layers} layers (indices 0..{lm.num_layers}); set "
                         "eagle_aux_hidden_state_layer_ids for this target")
    return tuple(layers)


def check_fits(head: Eagle3Head, lm: CausalLM) -> None:
    """Raise naming the file, the key and both shapes when the head does not fit the target."""
    config_file, weights_file = head.files
    spec = head.spec
    if spec.layer.vocab_size != lm.vocab_size:
        raise ValueError(f"eagle3: {config_file}: 'vocab_size' is {spec.layer.vocab_size} but the target's LM head "
                         f"has {lm.vocab_size} rows; use an EAGLE-3 head trained for this target")
    count = len(layers_for(head, lm))
    fused = count * lm.hidden_size
    if head.fc.in_features != fused:
        raise ValueError(f"eagle3: {weights_file}: 'fc.weight' has shape {tuple(head.fc.weight.shape)} but the "
                         f"target's {count} hidden states need "
                         f"{(head.fc.out_features, fused)} (target hidden size {lm.hidden_size})")
    if head.embed_tokens is None:
        target = tuple(cast(torch.Tensor, lm.embed_tokens.weight).shape)
        if target[1] != head.config.hidden_size:
            raise ValueError(f"eagle3: {weights_file} has no 'embed_tokens.weight' and the target's embedding "
                             f"{target} does not match the head's hidden size {head.config.hidden_size}")


class Eagle3Drafter(DraftsThroughForms):
    """Drafts with an EAGLE-3 head loaded from `path` (either layout).

    tree=True drafts EAGLE-2 dynamic trees, as `eagle` does (`specdec.drafters.tree_search.graph`),
    else a chain; sample and siblings as for `eagle`. The head's cache is static and its steps
    fixed-shape, compiled when the generation compiles; a batch drafts every row in one forward
    per depth (`specdec.drafters.shared.forms`).
    """

    name: ClassVar[str] = "eagle3"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.STATE, Capability.HIDDEN_STATES,
                                                               Capability.TREES, Capability.CACHE_LENGTH})
    tree_options: ClassVar[dict[str, Any]] = {"tree": True}

    def __init__(self, path: str | Path, tree: bool = False, top_k: int = 4, total_tokens: int = 16,
                 depth: int | None = None, value_temperature: float = 1.0, sample: bool = True,
                 siblings: str = "without_replacement") -> None:
        self.tree = tree_settings("eagle3", tree, top_k, total_tokens, depth, value_temperature, siblings)
        if not isinstance(sample, bool):
            raise ValueError(f"eagle3: sample must be true or false, got {sample!r}")
        self.sample = sample
        self.head = load_eagle3(path)
        self.vocab = TargetVocab(self.head)
        self._forms = Forms(lambda: Eagle3Row(self), lambda: FeatureBatch(self))

    def hidden_layers(self, target: CausalLM) -> tuple[int, ...]:
        return layers_for(self.head, target)

    def max_draft_nodes(self, k: int) -> int:
        return k if self.tree is None else self.tree.total_tokens

    def embed(self, ctx: DraftContext) -> nn.Module:
        """The head's own embedding, else the target's."""
        return self.head.embed_tokens if self.head.embed_tokens is not None else ctx.target.embed_tokens

    def setup(self, ctx: DraftContext) -> None:
        """Check that the head fits ctx's target and move it there."""
        check_fits(self.head, ctx.target)
        self.head.to(device=ctx.target.device, dtype=ctx.target.dtype)
        rotary = self.head.rotary_emb  # its frequencies stay float32 whatever the head's dtype
        rotary.inv_freq = rotary.original_inv_freq.to(device=ctx.target.device, dtype=torch.float32)
        self.vocab.to(device=ctx.target.device)

    def batch_parts(self, ctx: DraftContext) -> FeatureParts:
        self.setup(ctx)
        return FeatureParts("eagle3", self.head, "the EAGLE-3 head", pair_forward, self.embed(ctx), self.vocab)


class Eagle3Row:
    """One row's EAGLE-3 drafting on a head cache of its own (the row form, `specdec.drafters.shared.forms`)."""

    def __init__(self, drafter: Eagle3Drafter) -> None:
        self.drafter, self.tree, self.sample, self.vocab = drafter, drafter.tree, drafter.sample, drafter.vocab
        self.steps = HeadSteps(drafter.head, "the EAGLE-3 head")
        self._out: torch.Tensor | None = None  # [1, H] the head's output at the last committed pair
        self._real = 0

    @property
    def cache_length(self) -> int:
        return self.steps.length

    def _embed(self, ctx: DraftContext) -> nn.Module:
        return self.drafter.embed(ctx)

    def prefill(self, ctx: DraftContext) -> None:
        self.drafter.setup(ctx)
        k = ctx.engine.max_draft
        self.steps.reset(ctx.engine, extra=k + 1 + k * (self.tree.top_k if self.tree else 1))
        self._out = None
        self._feed_pending(ctx, eager=True, hold=PREFILL_HOLD)  # the last pair waits for the first draft

    def _feed_pending(self, ctx: DraftContext, eager: bool = False, hold: int = 0) -> None:
        """Feed the real pairs (x_{j+1}, fused states at j) not yet cached; keep the last output."""
        out = feed_pending(self.steps, ctx, "eagle3", eager, embed=self._embed(ctx), hold=hold)
        if out is not None:
            self._out = out

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        sampled = self.sample and not ctx.sampling.greedy  # draw the draft (reporting q), else argmax / top-k
        topk = None if sampled else self.tree
        if k > 0 and (self.tree is None or topk is not None):  # the usual draft: catch-up and draft in one step
            draft = fed_chain_draft(self.steps, ctx, "eagle3", k, self.vocab, self._embed(ctx), topk, sampled)
            if draft is not None:
                self._real = self.steps.length - draft_entries(topk, k, ctx)  # the entries past it came from drafts
                return draft
        self._feed_pending(ctx, eager=shallower_tree(topk, ctx, k))
        self._real = self.steps.length
        if k <= 0 or self._out is None:
            return Draft(ctx.tokens[:0])
        if self.tree is not None:
            tree_draft = topk_tree_draft if topk is not None else sampled_tree_draft
            return tree_draft(self.steps, ctx, k, self.tree, self.vocab, self._embed(ctx), self._out)
        return chain_draft(self.steps, ctx, k, self.vocab, self._embed(ctx), self._out, sampled)

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        self.steps.kv.rollback(min(self._real, self.steps.length))
        self._out = None
