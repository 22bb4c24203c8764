"""EAGLE-1: feature-level autoregression on the target's own hidden states.

Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty".
At position j the head reads fc(cat(embed(x_{j+1}), f_j)) (2H -> H, concat order
[embedding, feature] as in the public EAGLE code), where f_j is the target's last-layer
post-final-norm hidden state at j and `embed` is the TARGET's embedding. One decoder layer of
the architecture the checkpoint's config.json names (Llama in published EAGLE-1 checkpoints,
whatever the target), its input norm removed, predicts f_{j+1}; the TARGET's LM head turns that
feature into the next token's logits. Drafting feeds each predicted feature back as the next
input: (d_1, f̂_{T-1}) -> f̂_T -> d_2, and so on.

Checkpoint: a directory with config.json (1 layer, `architectures`, optional `bias`) and
`fc.weight`, `fc.bias`, `layers.0.*` (no `layers.0.input_layernorm.*`) in model.safetensors or
pytorch_model.bin; an `embed_tokens.weight` copy is shape-checked and ignored.

State invariant (T = len(ctx.tokens)): the head's KV cache holds one entry per REAL pair
(x_{j+1}, f_j), j = 0..C-1, with C = T - 1 - P where P is the number of real pairs received
(ctx.hidden_states rows) and not yet fed. After prefill P = 0; after each commit P is the number
of hidden-state rows just received: drafted-feature entries are cropped away. Propose feeds the
P pending pairs in one forward (its last output f̂_{T-1} gives d_1), then k - 1 one-position
forwards of (d_i, f̂) at positions T-1, T, ...; commit crops back to the T - 1 real entries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from torch import nn
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.masking_utils import create_causal_mask

from specdec.drafters.feature_heads.feature_batch import FeatureBatch, FeatureParts, pair_forward
from specdec.drafters.feature_heads.feature_drafts import (chain_draft, draft_entries, fed_chain_draft, sampled_tree_draft,
                                             shallower_tree, topk_tree_draft)
from specdec.drafters.feature_heads.feature_pairs import PREFILL_HOLD, feed_pending
from specdec.drafters.feature_heads.head_steps import HeadSteps
from specdec.drafters.feature_heads.layers import decoder_layer_classes
from specdec.drafters.shared.forms import DraftsThroughForms, Forms
from specdec.drafters.tree_search.dynamic import tree_settings
from specdec.drafters.feature_heads.weights import HEAD_FILES, PICKLE, SAFETENSORS, read_weights
from specdec.protocols import Capability, DraftContext
from specdec.runtime.cache import new_cache
from specdec.runtime.forward import LAST_LAYER
from specdec.runtime.target import CausalLM
from specdec.types import Draft

__all__ = ["EagleDrafter", "EagleHead", "EagleRow", "load_eagle", "save_eagle"]

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "layers.0.input_layernorm.weight")  # EAGLE never uses them


class EagleHead(nn.Module):
    """fc (2H -> H) and one decoder layer without its input norm: (embeddings, features) -> features."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        if config.num_hidden_layers != 1:
            raise ValueError(f"eagle: EAGLE-1 heads have one decoder layer, the config has "
                             f"num_hidden_layers={config.num_hidden_layers}")
        config._attn_implementation = "sdpa"
        self.config = config
        layer_class, rotary_class = decoder_layer_classes(config, "eagle")
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=bool(getattr(config, "bias", True)))
        layer = layer_class(config, 0)
        layer.input_layernorm = nn.Identity()  # EAGLE-1 drops layer 0's input norm
        self.layers = nn.ModuleList([layer])
        self.rotary_emb = rotary_class(config)  # buffers only, not saved
        self.files: tuple[Path | str, Path | str] = ("config.json", "the weights")  # for error messages
        self.embed_shape: tuple[int, ...] | None = None  # of a stored embed_tokens.weight copy

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: Cache | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """embeds, features [n, H] or [B, n, H] (training, a batch), positions [n] or [B, n] (absolute) -> predicted next
        features, shaped like `embeds`. `mask`: an additive [1, 1, n, C + n] tree mask instead of
        the causal one."""
        x = self.fc(torch.cat([embeds, features], dim=-1))
        single = x.dim() == 2
        x = x[None] if single else x  # (B, n, H)
        position_ids = positions if positions.dim() == 2 else positions[None]  # (B or 1, n)
        mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=mask, cache=cache,
                                  position_ids=position_ids)  # a 4D tree mask comes back as it is
        out = self.layers[0](x, attention_mask=mask, position_ids=position_ids, cache=cache,
                             use_cache=cache is not None,
                             position_embeddings=self.rotary_emb(x, position_ids=position_ids))
        out = out[0] if isinstance(out, tuple) else out  # (B, n, H)
        return out[0] if single else out

    def new_cache(self) -> Cache:
        return new_cache(cast(PreTrainedModel, self))  # only reads .config (a 1-layer layout)


def load_eagle(path: str | Path, target: CausalLM | PreTrainedModel | None = None) -> EagleHead:
    """Read an EAGLE-1 checkpoint directory (or hub id); with `target`, check it fits and follow its
    device/dtype."""
    from specdec.checkpoints import resolve_checkpoint

    path = resolve_checkpoint(path, "EAGLE head", HEAD_FILES)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"eagle: {str(path)!r} is not an EAGLE checkpoint (no config.json)")
    config = AutoConfig.from_pretrained(str(path))
    head = EagleHead(config)
    file, weights = read_weights(path, "eagle")
    expected = head.state_dict()
    unexpected = sorted(key for key in weights if key not in expected and key != "embed_tokens.weight"
                        and not key.endswith(_IGNORED_SUFFIXES))
    if unexpected:
        raise ValueError(f"eagle: {file} holds keys an EAGLE-1 head does not have: {unexpected[:5]}; "
                         "is it an EAGLE-2/3 or Medusa checkpoint?")
    for key, tensor in expected.items():
        if key not in weights:
            raise KeyError(f"eagle: {file} lacks {key!r} (expected shape {tuple(tensor.shape)})")
        if weights[key].shape != tensor.shape:
            raise ValueError(f"eagle: {file}: {key!r} has shape {tuple(weights[key].shape)}, expected "
                             f"{tuple(tensor.shape)} from {path / 'config.json'}")
    head.to(dtype=weights["fc.weight"].dtype)  # keep the stored precision until a target says otherwise
    head.load_state_dict({key: weights[key] for key in expected})
    head.embed_shape = tuple(weights["embed_tokens.weight"].shape) if "embed_tokens.weight" in weights else None
    head.files = (path / "config.json", file)
    if target is not None:
        lm = target if isinstance(target, CausalLM) else CausalLM(target)
        check_fits(head, lm)
        head.to(device=lm.device, dtype=lm.dtype)
    return head.eval()


def check_fits(head: EagleHead, lm: CausalLM) -> None:
    """Raise naming the file, the key and both shapes when the head does not fit the target."""
    config_file, weights_file = head.files
    hidden, vocab = head.config.hidden_size, head.config.vocab_size
    if hidden != lm.hidden_size:
        raise ValueError(f"eagle: {weights_file}: 'fc.weight' has shape {tuple(head.fc.weight.shape)} "
                         f"(hidden_size {hidden} in {config_file}) but the target's hidden states need "
                         f"{(lm.hidden_size, 2 * lm.hidden_size)} (hidden size {lm.hidden_size})")
    if vocab != lm.vocab_size:
        raise ValueError(f"eagle: {config_file}: 'vocab_size' is {vocab} but the target's LM head has "
                         f"{lm.vocab_size} rows; use an EAGLE head trained for this target")
    embed_shape = head.embed_shape
    target_shape = tuple(cast(torch.Tensor, lm.embed_tokens.weight).shape)
    if embed_shape is not None and embed_shape != target_shape:
        raise ValueError(f"eagle: {weights_file}: 'embed_tokens.weight' has shape {embed_shape} but the "
                         f"target's embedding has {target_shape}; use an EAGLE head trained for this target")


def save_eagle(head: EagleHead, path: str | Path, safe: bool = True) -> Path:
    """Write `head` as an EAGLE-1 checkpoint directory (config.json + safetensors or .bin)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    config["architectures"] = config.get("architectures") or ["LlamaForCausalLM"]
    config["bias"] = head.fc.bias is not None
    config.pop("_attn_implementation_autoset", None)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    state = {key: tensor.detach().cpu().contiguous() for key, tensor in head.state_dict().items()}
    if safe:
        from safetensors.torch import save_file

        save_file(state, str(path / SAFETENSORS), metadata={"format": "pt"})
    else:
        torch.save(state, path / PICKLE)
    return path


class EagleDrafter(DraftsThroughForms):
    """Drafts with an EAGLE-1 head loaded from `path`, on the target's embedding and LM head.

    tree=True drafts EAGLE-2 dynamic trees (`specdec.drafters.tree_search.graph`: the catch-up and the
    whole tree one step): top_k children per expanded node, top_k nodes expanded per depth, the
    total_tokens most probable nodes kept, depth levels at most (None: the loop's k), node values
    at value_temperature; at temperature > 0 the siblings are draws from the head's processed
    distribution instead (reported as q), distinct (siblings="without_replacement", the default)
    or i.i.d. (siblings="iid"), total_tokens split evenly over the levels (`grow_sampled_tree`, a forward per
    depth). Otherwise a chain, sampled from the head's processed distribution at temperature > 0.
    sample=False drafts the argmax chain or the top-k tree at every temperature (no q: the
    verifier's sample-and-match). The head's cache is static and its steps
    fixed-shape (`specdec.drafters.feature_heads.head_steps`), compiled when the generation compiles;
    a batch drafts every row in one forward per depth (`specdec.drafters.shared.forms`).
    """

    name: ClassVar[str] = "eagle"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.STATE, Capability.HIDDEN_STATES,
                                                               Capability.TREES, Capability.CACHE_LENGTH})
    tree_options: ClassVar[dict[str, Any]] = {"tree": True}  # the options that make it draft trees (bench rows)

    def __init__(self, path: str | Path, tree: bool = False, top_k: int = 4, total_tokens: int = 16,
                 depth: int | None = None, value_temperature: float = 1.0, sample: bool = True,
                 siblings: str = "without_replacement") -> None:
        self.tree = tree_settings("eagle", tree, top_k, total_tokens, depth, value_temperature, siblings)
        if not isinstance(sample, bool):
            raise ValueError(f"eagle: sample must be true or false, got {sample!r}")
        self.sample = sample
        self.head = load_eagle(path)
        self._forms = Forms(lambda: EagleRow(self), lambda: FeatureBatch(self))

    def hidden_layers(self, target: CausalLM) -> tuple[int, ...]:
        return (LAST_LAYER,)  # the post-norm last layer

    def max_draft_nodes(self, k: int) -> int:
        return k if self.tree is None else self.tree.total_tokens

    def setup(self, ctx: DraftContext) -> None:
        """Check that the head fits ctx's target and move it there."""
        check_fits(self.head, ctx.target)
        self.head.to(device=ctx.target.device, dtype=ctx.target.dtype)

    def batch_parts(self, ctx: DraftContext) -> FeatureParts:
        self.setup(ctx)
        return FeatureParts("eagle", self.head, "the EAGLE head", pair_forward, ctx.target.embed_tokens,
                            ctx.target.lm_head)


class EagleRow:
    """One row's EAGLE drafting on a head cache of its own (the row form, `specdec.drafters.shared.forms`)."""

    def __init__(self, drafter: EagleDrafter) -> None:
        self.drafter, self.tree, self.sample = drafter, drafter.tree, drafter.sample
        self.steps = HeadSteps(drafter.head, "the EAGLE head")
        self._feature: torch.Tensor | None = None  # [1, H] f̂ of the last committed position
        self._real = 0  # cache entries from real pairs at the last propose

    @property
    def cache_length(self) -> int:
        return self.steps.length

    def prefill(self, ctx: DraftContext) -> None:
        self.drafter.setup(ctx)
        k = ctx.engine.max_draft
        self.steps.reset(ctx.engine, extra=k + 1 + k * (self.tree.top_k if self.tree else 1))
        self._feature = None
        self._feed_pending(ctx, eager=True, hold=PREFILL_HOLD)  # the last pair waits for the first draft

    def _feed_pending(self, ctx: DraftContext, eager: bool = False, hold: int = 0) -> None:
        """Feed the real pairs (x_{j+1}, f_j) not yet in the cache; keep the last predicted feature."""
        out = feed_pending(self.steps, ctx, "eagle", eager, hold=hold)
        if out is not None:
            self._feature = out

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        sampled = self.sample and not ctx.sampling.greedy  # draw the draft (reporting q), else argmax / top-k
        topk = None if sampled else self.tree
        if k > 0 and (self.tree is None or topk is not None):  # the usual draft: catch-up and draft in one step
            draft = fed_chain_draft(self.steps, ctx, "eagle", k, ctx.target.lm_head, ctx.target.embed_tokens, topk,
                                    sampled)
            if draft is not None:
                self._real = self.steps.length - draft_entries(topk, k, ctx)  # the entries past it came from drafts
                return draft
        self._feed_pending(ctx, eager=shallower_tree(topk, ctx, k))
        self._real = self.steps.length
        if k <= 0 or self._feature is None:  # a 1-token prompt: nothing to draft from yet
            return Draft(ctx.tokens[:0])
        if self.tree is not None:
            tree_draft = topk_tree_draft if topk is not None else sampled_tree_draft
            return tree_draft(self.steps, ctx, k, self.tree, ctx.target.lm_head, ctx.target.embed_tokens,
                              self._feature)
        return chain_draft(self.steps, ctx, k, ctx.target.lm_head, ctx.target.embed_tokens, self._feature, sampled)

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        # Entries past the real pairs came from drafted features: drop them. The accepted
        # positions return as real pairs from ctx.hidden_states at the next propose.
        self.steps.kv.rollback(min(self._real, self.steps.length))
        self._feature = None
