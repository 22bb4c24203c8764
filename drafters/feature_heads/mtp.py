"""MTP: the target's own multi-token-prediction module, read from the target's checkpoint
(`specdec.drafters.feature_heads.mtp_files`), as a drafter.

DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §2.2 Multi-Token Prediction; Gloeckle et al.
2024, "Better & Faster Large Language Models via Multi-token Prediction".
At position j a stage reads proj(cat(norm_e(embed(x_{j+1})), norm_h(h_j))) (2H -> H, concat order
[embedding, hidden]), where h_j is the target's last-layer post-final-norm hidden state and
`embed` the TARGET's embedding, runs it through decoder layer(s) of the target's own class
(forced to full attention), and the TARGET's LM head after the stage's final norm gives the
logits of x_{j+2}. Drafting feeds each stage output back with the drafted token, like EAGLE.

State invariant (T = len(ctx.tokens), P = hidden-state rows received and not yet fed): the MTP
cache holds one entry per REAL pair (x_{j+1}, h_j), j < T - 1 - P, fed through stage 0; drafted
entries are cropped away at commit (as in `specdec.drafters.feature_heads.eagle`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from torch import nn

from specdec.drafters.shared.chains import chain_length, cut_chain
from specdec.drafters.shared.forms import DraftsThroughForms, Forms
from specdec.drafters.feature_heads.feature_batch import FeatureBatch, FeatureParts
from specdec.drafters.feature_heads.feature_drafts import shallower_tree, tree_inputs
from specdec.drafters.feature_heads.feature_pairs import PREFILL_HOLD, chain_inputs, pending_pairs, pending_rows
from specdec.drafters.feature_heads.head_steps import HeadSteps
from specdec.drafters.feature_heads.mtp_files import INDEX, SAFETENSORS, load_mtp, mtp_checkpoint_keys
from specdec.drafters.feature_heads.mtp_head import MtpHead, MtpStage
from specdec.drafters.tree_search.graph import expansions, topk_tree, tree_depth
from specdec.drafters.tree_search.dynamic import DynamicTree, TreeColumns, TreeSearch, grow_sampled_tree, prefix_q, tree_settings
from specdec.protocols import Capability, DraftContext
from specdec.runtime.forward import LAST_LAYER
from specdec.runtime.target import CausalLM
from specdec.sampling import chain_sampling, pick
from specdec.trees import additive_mask
from specdec.types import Draft, Sampling

# the checkpoint's names stay importable from here, where they were documented
__all__ = ["INDEX", "SAFETENSORS", "MtpDrafter", "MtpRow", "MtpHead", "load_mtp", "mtp_checkpoint_keys"]


def check_fits(head: MtpHead, lm: CausalLM) -> None:
    """Raise naming the file, the key and both shapes when the head does not fit the target."""
    proj = cast(MtpStage, head.stages[0]).proj.weight
    key = mtp_checkpoint_keys(head)["stages.0.proj.weight"]
    if tuple(proj.shape) != (lm.hidden_size, 2 * lm.hidden_size):
        raise ValueError(f"mtp: {head.file}: {key!r} has shape {tuple(proj.shape)} but the target's hidden "
                         f"states need {(lm.hidden_size, 2 * lm.hidden_size)} (hidden size {lm.hidden_size}); "
                         "use the checkpoint of this target")


def mtp_chain(head: Any, cache: Any, out: tuple[torch.Tensor, torch.Tensor], lm_head: nn.Module, embed: nn.Module,
              positions: torch.Tensor, uniforms: torch.Tensor | None, sampling: Sampling, stages: tuple[int, ...],
              k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chain of k draft tokens from the stage output at the last committed position, `out` =
    (the fed-back feature, the LM-head input), [1, H] each: each token from the LM head (`pick`:
    argmax, or a draw at uniforms[i]), each further output from stage stages[i] at positions[i].
    Returns tokens [k] and q [k, V] (None without uniforms)."""
    feature, logit_input = out
    tokens: list[torch.Tensor] = []
    rows: list[torch.Tensor] = []
    for i in range(k):
        token, probs = pick(lm_head(logit_input), sampling, None if uniforms is None else uniforms[i : i + 1])
        tokens.append(token)
        if probs is not None:
            rows.append(probs)
        if i + 1 < k:
            feature, logit_input = head(stages[i], embed(token), feature, positions[i : i + 1], cache)
    return torch.cat(tokens), torch.cat(rows) if rows else None


def mtp_tree(head: Any, cache: Any, out: tuple[torch.Tensor, torch.Tensor], lm_head: nn.Module, embed: nn.Module,
             real: torch.Tensor, start: torch.Tensor, width: int | None, tree: DynamicTree, depth: int,
             stages: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """An EAGLE-2 top-k tree (`specdec.drafters.tree_search.graph.topk_tree`) from the stage output at the
    last committed position, `out` = (the fed-back feature, the LM-head input), [1, H] each:
    expansion e runs its nodes through stage stages[e - 1] with their parents' fed-back features.
    Returns tokens [n] and parents [n]."""
    feature, logit_input = out

    def expand(e: int, tokens: torch.Tensor, states: tuple[torch.Tensor, ...], positions: torch.Tensor,
               mask: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        fed_back, logit_in = head(stages[e - 1], embed(tokens), states[0], positions, cache, mask)  # (K, H) each
        return (fed_back,), lm_head(logit_in)

    return topk_tree(expand, lm_head(logit_input)[0], (feature,), real, start, width, tree, depth)


def _stage_forward(head: MtpHead, cache: Any, mask: torch.Tensor, stage: int, embeds: torch.Tensor,
                   features: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The MTP module's batched forward through stage `stage` (`specdec.drafters.feature_heads.feature_batch`)."""
    return head(stage, embeds, features, positions, cache, mask)


class MtpDrafter(DraftsThroughForms):
    """Drafts with the MTP module stored in the target checkpoint at `path` (a directory or a hub id).

    sample=False drafts the argmax (no q); sample=True draws from the processed distribution
    `ctx.probabilities` (the verifier's pipeline, from its own draft prefix) and reports it as q.
    tree=True drafts a dynamic tree instead (`specdec.drafters.tree_search.graph`, one step): the top_k tokens
    per depth under each of the top_k most probable nodes of the depth before, the total_tokens
    most probable nodes kept, depth levels at most (None: the loop's k), node values at
    value_temperature; stage d runs depth d. With sample=True and temperature > 0 the siblings
    are draws from the processed distribution (reported as q) instead of a top-k: distinct
    (siblings="without_replacement", the default) or i.i.d. (siblings="iid"). A batch drafts every
    row in one forward per depth (`specdec.drafters.shared.forms`).
    """

    name: ClassVar[str] = "mtp"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.STATE, Capability.HIDDEN_STATES,
                                                               Capability.TREES, Capability.CACHE_LENGTH})
    tree_options: ClassVar[dict[str, Any]] = {"tree": True}  # the options that make it draft trees (bench rows)

    def __init__(self, path: str | Path, sample: bool = False, tree: bool = False, top_k: int = 4,
                 total_tokens: int = 16, depth: int | None = None, value_temperature: float = 1.0,
                 siblings: str = "without_replacement") -> None:
        self.tree = tree_settings("mtp", tree, top_k, total_tokens, depth, value_temperature, siblings)
        self.head = load_mtp(path)
        self.sample = bool(sample)
        self.head_name = "the MTP module"
        self._forms = Forms(lambda: MtpRow(self), lambda: FeatureBatch(self))

    def hidden_layers(self, target: CausalLM) -> tuple[int, ...]:
        return (LAST_LAYER,)  # the post-norm last layer

    def max_draft_nodes(self, k: int) -> int:
        return k if self.tree is None else self.tree.total_tokens

    def stage(self, depth: int) -> int:
        """The stage that runs `depth` (0-based): the last one for depths beyond the stages."""
        return min(depth, len(self.head.stages) - 1)

    def setup(self, ctx: DraftContext) -> None:
        """Check that the module fits ctx's target and move it there, its experts on the target's kernels."""
        check_fits(self.head, ctx.target)
        self.head.to(device=ctx.target.device, dtype=ctx.target.dtype)
        experts = getattr(ctx.target.config, "_experts_implementation", None)
        if experts is not None:  # run MoE experts with the target's kernels (float64 needs "eager")
            self.head.layer_config._experts_implementation = experts
        self.head_name = f"the MTP module ({experts} experts)" if experts is not None else "the MTP module"

    def batch_parts(self, ctx: DraftContext) -> FeatureParts:
        self.setup(ctx)
        return FeatureParts("mtp", self.head, self.head_name, _stage_forward, ctx.target.embed_tokens,
                            ctx.target.lm_head, len(self.head.stages))


class MtpRow:
    """One row's MTP drafting on a module cache of its own (the row form, `specdec.drafters.shared.forms`)."""

    def __init__(self, drafter: MtpDrafter) -> None:
        self.drafter, self.tree, self.sample = drafter, drafter.tree, drafter.sample
        self.steps = HeadSteps(drafter.head, drafter.head_name)
        self._feature: torch.Tensor | None = None  # [1, H] fed-back feature at the last committed position
        self._logit_input: torch.Tensor | None = None  # [1, H] normed output giving d_1
        self._real = 0

    @property
    def cache_length(self) -> int:
        return self.steps.length

    def _stage(self, depth: int) -> int:
        return self.drafter.stage(depth)

    def prefill(self, ctx: DraftContext) -> None:
        self.drafter.setup(ctx)
        self.steps.name = self.drafter.head_name
        k = ctx.engine.max_draft
        self.steps.reset(ctx.engine, extra=k + 1 + k * (self.tree.top_k if self.tree else 1))
        self._feature = self._logit_input = None
        self._feed_pending(ctx, eager=True, hold=PREFILL_HOLD)  # the last pair waits for the first draft

    def _feed_pending(self, ctx: DraftContext, eager: bool = False, hold: int = 0) -> None:
        """Feed the real pairs (x_{j+1}, h_j) not yet in the cache through stage 0."""
        pairs = pending_pairs(ctx, self.cache_length, "mtp", hold=hold)
        if pairs is not None:
            embeds, features, positions = pairs
            rows = None if eager else pending_rows(embeds.shape[0], ctx.engine.max_draft)
            feature, logit_input = self.steps(rows, 0, embeds, features, positions)
            self._feature, self._logit_input = feature[-1:], logit_input[-1:]  # (1, H) each

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        target = ctx.target
        sampled = self.sample and not ctx.sampling.greedy
        topk = None if sampled else self.tree  # a top-k tree, unless its siblings are sampled
        n = k if topk is not None else chain_length(ctx, k)  # a chain the budget's end cuts short: the usual one, cut
        fused = topk is not None or (self.tree is None and not ctx.sampling.reads_prefix)
        if n == ctx.engine.max_draft and fused:  # catch-up and draft in one step
            pairs = pending_pairs(ctx, self.cache_length, "mtp")
            rows = None if pairs is None else pending_rows(pairs[0].shape[0], n)
            if pairs is not None and rows is not None:
                if topk is not None:
                    depth = tree_depth(topk, k)
                    inputs = tree_inputs(self.steps, ctx, topk, self.cache_length + pairs[0].shape[0])
                    tokens, parents = self.steps.fed_chain(mtp_tree, rows, (0, *pairs), expansions(topk, depth),
                                                           target.lm_head, target.embed_tokens, *inputs, topk,
                                                           depth, self._stages(depth))
                    self._real = self.cache_length - expansions(topk, depth)  # the entries past it came from drafts
                    return Draft(tokens, None, parents)
                positions, uniforms = chain_inputs(ctx, n, sampled)
                tokens, probs = self.steps.fed_chain(mtp_chain, rows, (0, *pairs), n - 1, target.lm_head,
                                                     target.embed_tokens, positions, uniforms, ctx.sampling,
                                                     self._stages(n), n)
                self._real = self.cache_length - (n - 1)
                return cut_chain(tokens, probs, k)
        self._feed_pending(ctx, eager=shallower_tree(topk, ctx, k))
        self._real = self.cache_length
        if k <= 0 or self._feature is None or self._logit_input is None:  # nothing to draft from yet
            return Draft(ctx.tokens[:0])
        out = (self._feature, self._logit_input)
        if topk is not None:
            depth = tree_depth(topk, k)
            tokens, parents = self.steps.chain(mtp_tree, expansions(topk, depth), out, target.lm_head,
                                               target.embed_tokens, *tree_inputs(self.steps, ctx, topk, self._real),
                                               topk, depth, self._stages(depth),
                                               eager=shallower_tree(topk, ctx, k))  # a shape met once
            return Draft(tokens, None, parents)
        if self.tree is not None:
            return self._sampled_tree(ctx, k, self._feature, self._logit_input)
        positions, uniforms = chain_inputs(ctx, n, sampled)
        if n == ctx.engine.max_draft and not ctx.sampling.reads_prefix:  # the whole loop in one step, cut to k
            tokens, probs = self.steps.chain(mtp_chain, n - 1, out, target.lm_head, target.embed_tokens, positions,
                                             uniforms, ctx.sampling, self._stages(n), n)
            return cut_chain(tokens, probs, k)

        def head(stage: int, embeds: torch.Tensor, features: torch.Tensor, position: torch.Tensor,
                 cache: object) -> tuple[torch.Tensor, torch.Tensor]:  # a shorter chain (k=auto): stage by stage
            return self.steps(1, stage, embeds, features, position)

        # k tokens, not the whole loop's n: drafted step by step, nothing is drawn to be cut away
        tokens, probs = mtp_chain(head, None, out, target.lm_head, target.embed_tokens, positions, uniforms,
                                  chain_sampling(ctx), self._stages(k), k)
        return Draft(tokens, probs)

    def _stages(self, k: int) -> tuple[int, ...]:
        """The stage of each fed-back step of a draft of k: depth i + 2 uses stage i + 1 (the last beyond)."""
        return tuple(self._stage(i + 1) for i in range(k - 1))

    def _sampled_tree(self, ctx: DraftContext, k: int, root: torch.Tensor, root_input: torch.Tensor) -> Draft:
        """A tree of sampled siblings (`grow_sampled_tree`): a depth-d node runs through stage d
        with its parent's fed-back feature, in one forward per depth on top of the real entries, at
        position T - 2 + d."""
        assert self.tree is not None
        lm_head, embed = ctx.target.lm_head, ctx.target.embed_tokens
        columns = TreeColumns(self.steps.length, self.steps.width, rows=self.tree.top_k)
        outputs: dict[int, torch.Tensor] = {}  # expanded node -> its fed-back feature [H]
        start = ctx.tokens.shape[0] - 2

        def expand(search: TreeSearch, nodes: list[int]) -> torch.Tensor:
            depth = search.depths[nodes[0]]
            tokens = torch.tensor([search.tokens[n] for n in nodes], device=root.device)  # (f,)
            parents = torch.stack([outputs[search.parents[n]] if search.parents[n] >= 0 else root[0]
                                   for n in nodes])  # (f, H)
            positions = torch.full((len(nodes),), start + depth, device=root.device)
            rows = columns.padded(len(nodes))
            mask = additive_mask(columns.visible(search, nodes, root.device), root.dtype)
            fed_back, logit_input = self.steps(rows, self._stage(depth), embed(tokens), parents, positions, mask=mask)
            outputs.update(zip(nodes, fed_back))
            return lm_head(logit_input)  # (f, V)

        draft, _ = grow_sampled_tree(lm_head(root_input)[0], expand, self.tree, k, ctx.sampling, ctx.generator,
                                     prefix_q(ctx))
        return draft

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        self.steps.kv.rollback(min(self._real, self.cache_length))  # drop drafted entries
        self._feature = self._logit_input = None

