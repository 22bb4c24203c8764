"""The draft steps of the feature-level heads (EAGLE-1, EAGLE-3; MTP shares the tree inputs):
a chain fed back through (embed(d_i), the head's output) pairs, the greedy EAGLE-2 top-k tree
(`specdec.drafters.tree_search.graph`), each with the catch-up on the pending pairs in the same step
(`HeadSteps.fed_chain`), and the sampled tree of temperature > 0 (`grow_sampled_tree`). A head
is a module `head(embeds, features, positions, cache, mask)`; `logits` maps its outputs to
logits over the target's vocabulary."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specdec.drafters.shared.chains import chain_length, cut_chain
from specdec.drafters.feature_heads.feature_pairs import chain_inputs, pending_pairs, pending_rows
from specdec.drafters.feature_heads.head_steps import HeadSteps
from specdec.drafters.tree_search.graph import expansions, topk_tree, tree_depth
from specdec.drafters.tree_search.dynamic import DynamicTree, TreeColumns, TreeSearch, grow_sampled_tree, prefix_q
from specdec.protocols import DraftContext
from specdec.sampling import chain_sampling, pick
from specdec.trees import additive_mask
from specdec.types import Draft, Sampling

__all__ = ["chain_draft", "draft_entries", "eagle_chain", "eagle_tree", "fed_chain_draft",
           "sampled_tree_draft", "shallower_tree", "topk_tree_draft", "tree_inputs"]


def eagle_chain(head: Any, cache: Any, feature: torch.Tensor, lm_head: nn.Module, embed: nn.Module,
                positions: torch.Tensor, uniforms: torch.Tensor | None, sampling: Sampling, k: int
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chain of k draft tokens from the predicted feature [1, H]: each token from the LM head
    (`pick`: argmax, or a draw at uniforms[i]; `sampling` may be a `PrefixPicker`), each further
    feature from the head at positions[i] ([k - 1]). Returns tokens [k] and q [k, V] (None when greedy)."""
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
                feature: torch.Tensor, sampled: bool = True) -> Draft:
    """A chain of k tokens from a feature-level head's last output `feature` [1, H], fed back
    through (embed(d_i), feature) pairs at positions T-1, T, ...; `logits` maps a feature to [1, V].
    The usual draft (k = the loop's k) is one step, one graph when compiled, and so is one the
    budget's end cuts short (`chain_length`: the usual one, cut to k); a shorter one of k=auto runs
    head step by head step. `sampled`: draw each token at temperature > 0 (reported as q), else
    each token is the head's argmax."""
    n = chain_length(ctx, k)
    positions, uniforms = chain_inputs(ctx, n, sampled and not ctx.sampling.greedy)
    if n == ctx.engine.max_draft and not ctx.sampling.reads_prefix:
        tokens, probs = steps.chain(eagle_chain, n - 1, feature, logits, embed, positions, uniforms, ctx.sampling, n)
        return cut_chain(tokens, probs, k)

    def head(embeds: torch.Tensor, features: torch.Tensor, position: torch.Tensor, cache: object) -> torch.Tensor:
        return steps(1, embeds, features, position)

    tokens, probs = eagle_chain(head, None, feature, logits, embed, positions, uniforms, chain_sampling(ctx), k)
    return Draft(tokens, probs)


def eagle_tree(head: Any, cache: Any, root: torch.Tensor, logits: nn.Module, embed: nn.Module, real: torch.Tensor,
               start: torch.Tensor, width: int | None, tree: DynamicTree, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An EAGLE-2 top-k tree (`specdec.drafters.tree_search.graph.topk_tree`) from the head's output at the
    last committed pair [1, H]: each expanded node runs as the pair (embed(its token), its parent's
    output). Returns tokens [n] and parents [n]."""

    def expand(e: int, tokens: torch.Tensor, states: tuple[torch.Tensor, ...], positions: torch.Tensor,
               mask: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        out = head(embed(tokens), states[0], positions, cache, mask)  # (K, H)
        return (out,), logits(out)

    return topk_tree(expand, logits(root)[0], (root,), real, start, width, tree, depth)


def draft_entries(tree: DynamicTree | None, k: int, ctx: DraftContext) -> int:
    """Entries a feature-level head's usual draft of k writes past the real pairs: n - 1 fed-back
    pairs for a chain of n = `chain_length(ctx, k)`, top_k per expanded depth for a top-k tree."""
    return chain_length(ctx, k) - 1 if tree is None else expansions(tree, tree_depth(tree, k))


def fed_chain_draft(steps: HeadSteps, ctx: DraftContext, drafter: str, k: int, logits: nn.Module,
                    embed: nn.Module, tree: DynamicTree | None = None, sampled: bool = True) -> Draft | None:
    """The usual draft (k = the loop's k, or a chain the budget's end cuts short: `chain_length`)
    with the catch-up on the pairs not yet cached in the same step (`HeadSteps.fed_chain`: one graph
    when compiled, not two): a chain, or with `tree` the top-k tree (`eagle_tree`); `embed` embeds
    both. None when no pair is pending, or more than a padded step holds, or for a shorter draft:
    the caller then feeds them apart and drafts with `chain_draft` or `topk_tree_draft`. The
    head's cache then holds `draft_entries(tree, k, ctx)` more entries than the real pairs."""
    pairs = pending_pairs(ctx, steps.length, drafter, embed)
    rows = None if pairs is None else pending_rows(pairs[0].shape[0], ctx.engine.max_draft)
    if pairs is None or rows is None or (k if tree is not None else chain_length(ctx, k)) != ctx.engine.max_draft:
        return None
    if tree is None and ctx.sampling.reads_prefix:  # each draw from its own prefix: step by step, on the host
        return None
    if tree is not None:
        depth = tree_depth(tree, k)
        inputs = tree_inputs(steps, ctx, tree, steps.length + pairs[0].shape[0])
        tokens, parents = steps.fed_chain(eagle_tree, rows, pairs, expansions(tree, depth), logits, embed, *inputs,
                                          tree, depth)
        return Draft(tokens, None, parents)
    n = ctx.engine.max_draft
    positions, uniforms = chain_inputs(ctx, n, sampled and not ctx.sampling.greedy)
    tokens, probs = steps.fed_chain(eagle_chain, rows, pairs, n - 1, logits, embed, positions, uniforms,
                                    ctx.sampling, n)
    return cut_chain(tokens, probs, k)


def tree_inputs(steps: HeadSteps, ctx: DraftContext, tree: DynamicTree, real: int
                ) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """A top-k tree's `real` (the head's real entries) and `start` (the position before depth 1,
    T - 2) as 0-d tensors, and its masks' width (None for a cache that grows)."""
    device = ctx.tokens.device
    width = steps.width(tree.top_k) if steps.kv.static else None
    return (torch.tensor(real).to(device, non_blocking=True),
            torch.tensor(ctx.tokens.shape[0] - 2).to(device, non_blocking=True), width)


def shallower_tree(tree: DynamicTree | None, ctx: DraftContext, k: int) -> bool:
    """Whether a greedy top-k tree drafted for k (None: no such tree) is shallower than the usual
    one, as at the budget's end: a shape met once per generation, so it runs eagerly, and so does
    the catch-up on the pending pairs before it."""
    return tree is not None and tree_depth(tree, k) != tree_depth(tree, ctx.engine.max_draft)


def topk_tree_draft(steps: HeadSteps, ctx: DraftContext, k: int, tree: DynamicTree, logits: nn.Module,
                    embed: nn.Module, root: torch.Tensor) -> Draft:
    """An EAGLE-2 top-k tree from the root's output [1, H] on top of the real entries, as one step
    (one graph when compiled; a shallower tree than usual, at the budget's end, runs eagerly)."""
    depth = tree_depth(tree, k)
    tokens, parents = steps.chain(eagle_tree, expansions(tree, depth), root, logits, embed,
                                  *tree_inputs(steps, ctx, tree, steps.length), tree, depth,
                                  eager=shallower_tree(tree, ctx, k))
    return Draft(tokens, None, parents)


def sampled_tree_draft(steps: HeadSteps, ctx: DraftContext, k: int, tree: DynamicTree, logits: nn.Module,
                       embed: nn.Module, root: torch.Tensor) -> Draft:
    """A tree of sampled siblings (`grow_sampled_tree`, temperature > 0) from the root's
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

    draft, _ = grow_sampled_tree(logits(root)[0], expand, tree, k, ctx.sampling, ctx.generator, prefix_q(ctx))
    return draft
