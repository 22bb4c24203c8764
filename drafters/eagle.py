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

from specdec.cache import new_cache
from specdec.drafters.feature_pairs import chain_inputs, feed_pending, pending_pairs, pending_rows
from specdec.drafters.head_steps import HeadSteps
from specdec.drafters.layers import decoder_layer_classes
from specdec.drafters.tree_graph import expansions, topk_tree, tree_depth
from specdec.drafters.tree_search import DynamicTree, TreeColumns, TreeSearch, grow_sampled_tree, tree_settings
from specdec.drafters.weights import PICKLE, SAFETENSORS, read_weights
from specdec.protocols import DraftContext
from specdec.sampling import pick
from specdec.target import CausalLM
from specdec.trees import additive_mask
from specdec.types import Draft, Sampling

__all__ = ["EagleDrafter", "EagleHead", "chain_draft", "draft_entries", "eagle_tree", "fed_chain_draft", "load_eagle",
           "sampled_tree_draft", "save_eagle", "topk_tree_draft"]

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
        """embeds, features [n, H] or [B, n, H] (training), positions [n] (absolute) -> predicted next
        features, shaped like `embeds`. `mask`: an additive [1, 1, n, C + n] tree mask instead of
        the causal one."""
        x = self.fc(torch.cat([embeds, features], dim=-1))
        single = x.dim() == 2
        x = x[None] if single else x  # (B, n, H)
        position_ids = positions[None]  # (1, n)
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

    path = resolve_checkpoint(path, "EAGLE head")
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


def eagle_chain(head: Any, cache: Any, feature: torch.Tensor, lm_head: nn.Module, embed: nn.Module,
                positions: torch.Tensor, uniforms: torch.Tensor | None, sampling: Sampling, k: int
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chain of k draft tokens from the predicted feature [1, H]: each token from the LM head
    (`pick`: argmax, or a draw at uniforms[i]), each further feature from the head at
    positions[i] ([k - 1]). Returns tokens [k] and q [k, V] (None when greedy)."""
    tokens: list[torch.Tensor] = []
    rows: list[torch.Tensor] = []
    for i in range(k):
        token, probs = pick(lm_head(feature), sampling, None if uniforms is None else uniforms[i : i + 1])  # (1,)
        tokens.append(token)
        if probs is not None:
            rows.append(probs)
        if i + 1 < k:  # the feature after the last draft is never needed
            feature = head(embed(token), feature, positions[i : i + 1], cache)  # (1, H)
    return torch.cat(tokens), torch.cat(rows) if rows else None


def chain_draft(steps: HeadSteps, ctx: DraftContext, k: int, logits: nn.Module, embed: nn.Module,
                feature: torch.Tensor) -> Draft:
    """A chain of k tokens from a feature-level head's last output `feature` [1, H], fed back
    through (embed(d_i), feature) pairs at positions T-1, T, ...; `logits` maps a feature to [1, V].
    The usual draft (k = the loop's k) is one step, one graph when compiled; a shorter one (the
    budget's end, k=auto) runs head step by head step."""
    positions, uniforms = chain_inputs(ctx, k, not ctx.sampling.greedy)
    if k == ctx.engine.max_draft:
        tokens, probs = steps.chain(eagle_chain, k - 1, feature, logits, embed, positions, uniforms, ctx.sampling, k)
    else:

        def head(embeds: torch.Tensor, features: torch.Tensor, position: torch.Tensor, cache: object) -> torch.Tensor:
            return steps(1, embeds, features, position)

        tokens, probs = eagle_chain(head, None, feature, logits, embed, positions, uniforms, ctx.sampling, k)
    return Draft(tokens, probs)


def eagle_tree(head: Any, cache: Any, root: torch.Tensor, logits: nn.Module, embed: nn.Module, real: torch.Tensor,
               start: torch.Tensor, width: int | None, tree: DynamicTree, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An EAGLE-2 top-k tree (`specdec.drafters.tree_graph.topk_tree`) from the head's output at the
    last committed pair [1, H]: each expanded node runs as the pair (embed(its token), its parent's
    output). Returns tokens [n] and parents [n]."""

    def expand(e: int, tokens: torch.Tensor, states: tuple[torch.Tensor, ...], positions: torch.Tensor,
               mask: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        out = head(embed(tokens), states[0], positions, cache, mask)  # (K, H)
        return (out,), logits(out)

    return topk_tree(expand, logits(root)[0], (root,), real, start, width, tree, depth)


def draft_entries(tree: DynamicTree | None, k: int) -> int:
    """Entries a feature-level head's draft of k writes past the real pairs: k - 1 fed-back pairs
    for a chain, top_k per expanded depth for a top-k tree."""
    return k - 1 if tree is None else expansions(tree, tree_depth(tree, k))


def fed_chain_draft(steps: HeadSteps, ctx: DraftContext, drafter: str, k: int, logits: nn.Module,
                    embed: nn.Module, tree: DynamicTree | None = None) -> Draft | None:
    """The usual draft (k = the loop's k) with the catch-up on the pairs not yet cached in the
    same step (`HeadSteps.fed_chain`: one graph when compiled, not two): a chain, or with `tree`
    the top-k tree (`eagle_tree`); `embed` embeds both. None when no pair is pending, or more than
    a padded step holds (after a prefill): the caller then feeds them apart and drafts with
    `chain_draft` or `topk_tree_draft`."""
    pairs = pending_pairs(ctx, steps.length, drafter, embed)
    rows = None if pairs is None else pending_rows(pairs[0].shape[0], ctx.engine.max_draft)
    if pairs is None or rows is None or k != ctx.engine.max_draft:
        return None
    if tree is not None:
        depth = tree_depth(tree, k)
        inputs = tree_inputs(steps, ctx, tree, steps.length + pairs[0].shape[0])
        tokens, parents = steps.fed_chain(eagle_tree, rows, pairs, expansions(tree, depth), logits, embed, *inputs,
                                          tree, depth)
        return Draft(tokens, None, parents)
    positions, uniforms = chain_inputs(ctx, k, not ctx.sampling.greedy)
    tokens, probs = steps.fed_chain(eagle_chain, rows, pairs, k - 1, logits, embed, positions, uniforms,
                                    ctx.sampling, k)
    return Draft(tokens, probs)


def tree_inputs(steps: HeadSteps, ctx: DraftContext, tree: DynamicTree, real: int
                ) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """A top-k tree's `real` (the head's real entries) and `start` (the position before depth 1,
    T - 2) as 0-d tensors, and its masks' width (None for a cache that grows)."""
    device = ctx.tokens.device
    width = steps.width(tree.top_k) if steps.kv.static else None
    return (torch.tensor(real).to(device, non_blocking=True),
            torch.tensor(ctx.tokens.shape[0] - 2).to(device, non_blocking=True), width)


def topk_tree_draft(steps: HeadSteps, ctx: DraftContext, k: int, tree: DynamicTree, logits: nn.Module,
                    embed: nn.Module, root: torch.Tensor) -> Draft:
    """An EAGLE-2 top-k tree from the root's output [1, H] on top of the real entries, as one step
    (one graph when compiled; a shallower tree than usual, at the budget's end, runs eagerly)."""
    depth = tree_depth(tree, k)
    usual = depth == tree_depth(tree, ctx.engine.max_draft)
    tokens, parents = steps.chain(eagle_tree, expansions(tree, depth), root, logits, embed,
                                  *tree_inputs(steps, ctx, tree, steps.length), tree, depth, eager=not usual)
    return Draft(tokens, None, parents)


def sampled_tree_draft(steps: HeadSteps, ctx: DraftContext, k: int, tree: DynamicTree, logits: nn.Module,
                       embed: nn.Module, root: torch.Tensor) -> Draft:
    """A tree of i.i.d. sampled siblings (`grow_sampled_tree`, temperature > 0) from the root's
    output [1, H]: each depth's chosen nodes run as pairs (d, the parent's output) in one forward
    (padded to top_k rows) on top of the real entries, at position T - 2 + depth."""
    columns = TreeColumns(steps.length, steps.width, rows=tree.top_k)
    outputs: dict[int, torch.Tensor] = {}  # expanded node -> its output [H]
    start = ctx.tokens.shape[0] - 2

    def expand(search: TreeSearch, nodes: list[int]) -> torch.Tensor:
        tokens = torch.tensor([search.tokens[n] for n in nodes], device=root.device)  # (f,)
        parents = torch.stack([outputs[search.parents[n]] if search.parents[n] >= 0 else root[0]
                               for n in nodes])  # (f, H)
        positions = torch.full((len(nodes),), start + search.depths[nodes[0]], device=root.device)
        mask = additive_mask(columns.visible(search, nodes, root.device), root.dtype)
        out = steps(columns.padded(len(nodes)), embed(tokens), parents, positions, mask=mask)  # (f, H)
        outputs.update(zip(nodes, out))
        return logits(out)  # (f, V)

    draft, _ = grow_sampled_tree(logits(root)[0], expand, tree, k, ctx.sampling, ctx.generator)
    return draft


class EagleDrafter:
    """Drafts with an EAGLE-1 head loaded from `path`, on the target's embedding and LM head.

    tree=True drafts EAGLE-2 dynamic trees (`specdec.drafters.tree_graph`: the catch-up and the
    whole tree one step): top_k children per expanded node, top_k nodes expanded per depth, the
    total_tokens most probable nodes kept, depth levels at most (None: the loop's k), node values
    at value_temperature; at temperature > 0 the siblings are i.i.d. draws from the head's
    processed distribution instead (reported as q), total_tokens split evenly over the levels
    (`grow_sampled_tree`, a forward per depth). Otherwise a chain, sampled from the head's
    processed distribution at temperature > 0. The head's cache is static and its steps
    fixed-shape (`specdec.drafters.head_steps`), compiled when the generation compiles.
    """

    name: ClassVar[str] = "eagle"
    tree_options: ClassVar[dict[str, Any]] = {"tree": True}  # the options that make it draft trees (bench rows)
    uses_hidden_states: ClassVar[bool] = True

    def __init__(self, path: str | Path, tree: bool = False, top_k: int = 4, total_tokens: int = 16,
                 depth: int | None = None, value_temperature: float = 1.0) -> None:
        self.tree = tree_settings("eagle", tree, top_k, total_tokens, depth, value_temperature)
        self.head = load_eagle(path)
        self.steps = HeadSteps(self.head, "the EAGLE head")
        self._feature: torch.Tensor | None = None  # [1, H] f̂ of the last committed position
        self._real = 0  # cache entries from real pairs at the last propose

    @property
    def cache_length(self) -> int:
        return self.steps.length

    def max_draft_nodes(self, k: int) -> int:
        return k if self.tree is None else self.tree.total_tokens

    def prefill(self, ctx: DraftContext) -> None:
        check_fits(self.head, ctx.target)
        self.head.to(device=ctx.target.device, dtype=ctx.target.dtype)
        k = ctx.engine.max_draft
        self.steps.reset(ctx.engine, extra=k + 1 + k * (self.tree.top_k if self.tree else 1))
        self._feature = None
        self._feed_pending(ctx, eager=True)

    def _feed_pending(self, ctx: DraftContext, eager: bool = False) -> None:
        """Feed the real pairs (x_{j+1}, f_j) not yet in the cache; keep the last predicted feature."""
        out = feed_pending(self.steps, ctx, "eagle", eager)
        if out is not None:
            self._feature = out

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        topk = self.tree if ctx.sampling.greedy else None  # at temperature > 0 a tree's siblings are sampled
        if k > 0 and (self.tree is None or topk is not None):  # the usual draft: catch-up and draft in one step
            draft = fed_chain_draft(self.steps, ctx, "eagle", k, ctx.target.lm_head, ctx.target.embed_tokens, topk)
            if draft is not None:
                self._real = self.steps.length - draft_entries(topk, k)  # the entries past it came from drafts
                return draft
        self._feed_pending(ctx)
        self._real = self.steps.length
        if k <= 0 or self._feature is None:  # a 1-token prompt: nothing to draft from yet
            return Draft(ctx.tokens[:0])
        if self.tree is not None:
            tree_draft = topk_tree_draft if topk is not None else sampled_tree_draft
            return tree_draft(self.steps, ctx, k, self.tree, ctx.target.lm_head, ctx.target.embed_tokens,
                              self._feature)
        return chain_draft(self.steps, ctx, k, ctx.target.lm_head, ctx.target.embed_tokens, self._feature)

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        # Entries past the real pairs came from drafted features: drop them. The accepted
        # positions return as real pairs from ctx.hidden_states at the next propose.
        self.steps.kv.rollback(min(self._real, self.steps.length))
        self._feature = None
