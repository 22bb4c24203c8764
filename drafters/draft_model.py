"""A separate, smaller causal LM as the drafter (Leviathan et al. 2023; Chen et al. 2023).

The draft model shares the target's tokenizer. It keeps its own KV cache through the same
adapter as the target, rolled back to the committed prefix after each verify. Sampled drafts
report the processed distribution each token was drawn from; greedy drafts are its argmax.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import PreTrainedModel

from specdec.drafters.chains import chain_length, chain_uniforms, cut_chain
from specdec.drafters.tree_search import TreeColumns, TreeSearch, grow, prefix_q, tree_settings
from specdec.protocols import DraftContext
from specdec.runtime.forward import model_forward
from specdec.runtime.target import CausalLM
from specdec.sampling import chain_sampling, pick
from specdec.types import Draft, Sampling

__all__ = ["DraftModelDrafter"]


def _load(model: PreTrainedModel | str | Path, shard: bool = False) -> PreTrainedModel:
    if isinstance(model, PreTrainedModel):
        if shard:
            raise ValueError("draft-model: shard=true loads the model from its directory; pass a path, or a model "
                             "already loaded with tensor parallelism and shard=false")
        return model
    if isinstance(model, (str, Path)):
        from specdec.checkpoints import load_causal_lm, resolve_checkpoint
        from specdec.distributed.sharding import in_process_group, world_size

        path = resolve_checkpoint(model, "draft-model model")
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"draft-model: {str(path)!r} is not a model directory (no config.json)")
        if shard and not in_process_group():
            raise ValueError("draft-model: shard=true shards the draft model like the target, over the processes "
                             "of a torchrun launch; there is none (launch with torchrun, or drop shard=true)")
        return load_causal_lm(path, tp=world_size() if shard else 1)
    raise TypeError(f"draft-model: model= must be a transformers causal LM, a directory or a hub id, got {model!r}")


def draft_chain(model: Any, cache: Any, logits: torch.Tensor, uniforms: torch.Tensor | None, sampling: Sampling, k: int,
                step: Callable[..., torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chain of k draft tokens from the draft model's logits [1, V] for the first: each token
    by `pick` (argmax, or a draw at uniforms[i]), each further logits row from a forward of the
    token on `cache` (`step(model, cache, token)`, by default `model_forward`). Returns tokens
    [k] and q [k, V] (None when greedy)."""
    tokens: list[torch.Tensor] = []
    rows: list[torch.Tensor] = []
    for i in range(k):
        token, probs = pick(logits, sampling, None if uniforms is None else uniforms[i : i + 1])  # (1,)
        tokens.append(token)
        if probs is not None:
            rows.append(probs)
        if i + 1 < k:  # the logits after the last draft are never needed
            logits = step(model, cache, token) if step is not None else \
                model_forward(model, cache, token, 1, (), None, None)[0]  # (1, V)
    return torch.cat(tokens), torch.cat(rows) if rows else None


class DraftModelDrafter:
    """Drafts with `model` (a causal LM, a checkpoint directory or a hub id) on the target's vocabulary.

    A model loaded here from a directory follows the target's device and dtype; a model passed
    in must already be on the target's device.

    tree=True drafts EAGLE-2-style dynamic trees (`specdec.drafters.tree_search`): each depth's
    chosen nodes run in one tree-masked forward of the draft model, and after the verify the
    keys and values of the accepted path are gathered into place in its cache (they are exact:
    the draft model saw those very tokens), so nothing is recomputed. Options as for eagle:
    sample=True (the default) draws the draft at temperature > 0 and reports q, a tree's
    siblings distinct (siblings="without_replacement", the default) or i.i.d. (siblings="iid"); sample=False drafts the
    argmax chain or the top-k tree. Its cache is static and its
    steps fixed-shape like the target's (k + 1 rows, one row, top_k tree rows), compiled when
    the generation compiles; a chain's feed and its whole draft loop are one step.
    """

    name: ClassVar[str] = "draft-model"
    tree_options: ClassVar[dict[str, Any]] = {"tree": True}  # the options that make it draft trees (bench rows)

    def __init__(self, model: PreTrainedModel | str | Path, tree: bool = False, top_k: int = 4,
                 total_tokens: int = 16, depth: int | None = None, value_temperature: float = 1.0,
                 shard: bool = False, sample: bool = True, siblings: str = "without_replacement") -> None:
        self.tree = tree_settings("draft-model", tree, top_k, total_tokens, depth, value_temperature, siblings)
        if not isinstance(sample, bool):
            raise ValueError(f"draft-model: sample must be true or false, got {sample!r}")
        self.sample = sample
        self._columns: TreeColumns | None = None  # where the last tree's expanded nodes sit
        self._kept: list[int] = []  # search id of each node of the last tree draft
        self.lm = CausalLM(_load(model, bool(shard)), role="draft model")
        self._owns_model = not isinstance(model, PreTrainedModel)  # loaded here: follow the target
        self._committed = 0  # len(ctx.tokens) when the last draft was proposed
        self._max_draft = 0  # the loop's k in this generation

    @property
    def cache_length(self) -> int:
        return self.lm.cache_length

    def prefill(self, ctx: DraftContext) -> None:
        if self.lm.vocab_size != ctx.vocab_size:
            raise ValueError(
                f"draft-model: vocabulary mismatch: the draft model has {self.lm.vocab_size} "
                f"output tokens, the target {ctx.vocab_size}; use a draft model with the target's tokenizer"
            )
        if self._owns_model and (self.lm.device, self.lm.dtype) != (ctx.target.device, ctx.target.dtype):
            moved = self.lm.model.to(device=ctx.target.device, dtype=ctx.target.dtype)  # type: ignore[call-arg]
            self.lm = CausalLM(moved, role="draft model")
        if self.lm.device != ctx.target.device:
            raise ValueError(f"draft-model: the draft model is on {self.lm.device}, the target on "
                             f"{ctx.target.device}; move it with .to({str(ctx.target.device)!r})")
        k = ctx.engine.max_draft
        tree_rows = k * self.tree.top_k if self.tree is not None else k
        capacity = ctx.engine.capacity(extra=k + 1 + tree_rows) if ctx.engine.max_length else None
        self.lm.reset(capacity, compile=ctx.engine.compile)
        self._max_draft = k
        if ctx.tokens.shape[0] > 1:  # eager: the prompt's length varies
            self.lm.forward(ctx.tokens[:-1], keep=1)

    def max_draft_nodes(self, k: int) -> int:
        return k if self.tree is None else self.tree.total_tokens

    def _feed(self, pending: torch.Tensor) -> torch.Tensor:
        """Run the committed ids not yet in the cache (one after a rejection, two after a full
        acceptance, padded to k + 1 either way: one graph); (1, V)."""
        return self.lm.forward(pending, keep=1, rows=self._feed_rows(pending))[0]

    def _feed_rows(self, pending: torch.Tensor) -> int | None:
        """The fixed rows a feed of `pending` ids is padded to: k + 1 (None, unpadded, for more)."""
        return self._max_draft + 1 if pending.shape[0] <= self._max_draft + 1 else None

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self._committed = ctx.tokens.shape[0]
        self._columns = None
        if self.lm.max_positions is not None:  # a draft model with fewer positions drafts less
            k = min(k, self.lm.max_positions - self._committed)
        if k <= 0:
            return Draft(ctx.tokens[:0])
        pending = ctx.tokens[self.lm.cache_length :]  # (>= 1,) committed ids not yet in the cache
        if self.tree is not None:
            obstacle = self.lm.masked_obstacle
            if obstacle is not None:
                raise ValueError(f"draft-model: tree=True needs a draft model that can run tree forwards, but "
                                 f"{type(self.lm.model).__name__} cannot: {obstacle}")
            return self._propose_tree(ctx, k, pending)
        n = chain_length(ctx, k)  # a chain the budget's end cuts short: the usual one, cut to k
        if self.lm.max_positions is not None and self._committed + n > self.lm.max_positions:
            n = k
        uniforms = chain_uniforms(ctx, n, self.sample and not ctx.sampling.greedy)
        rows = self._feed_rows(pending)
        if n == self._max_draft and self.lm.static and rows is not None and not ctx.sampling.reads_prefix:
            # the usual draft: feed and loop, one step
            tokens, probs = self.lm.fed_chain(draft_chain, pending, rows, n - 1, uniforms, ctx.sampling, n)
            return cut_chain(tokens, probs, k)
        logits = self._feed(pending)  # (1, V)
        # a shorter chain (k=auto), or a model on a dynamic cache: forward by forward

        def step(model: object, cache: object, token: torch.Tensor) -> torch.Tensor:
            return self.lm.forward(token, keep=1, rows=1)[0]

        tokens, probs = draft_chain(None, None, logits, uniforms, chain_sampling(ctx), k, step)
        return Draft(tokens, probs)

    def _propose_tree(self, ctx: DraftContext, k: int, pending: torch.Tensor) -> Draft:
        """Run the pending ids (the cache then holds all T committed ids), then grow the tree,
        a depth-d node at position T - 1 + d seeing the committed ids and its ancestors."""
        assert self.tree is not None
        logits = self._feed(pending)  # (1, V)
        committed = ctx.tokens.shape[0]
        columns = TreeColumns(committed, self.lm.mask_width, rows=self.tree.top_k)

        def expand(search: TreeSearch, nodes: list[int]) -> torch.Tensor:
            rows = columns.padded(len(nodes))  # one shape per depth: padded to top_k rows
            tokens = torch.tensor([search.tokens[n] for n in nodes] + [0] * (rows - len(nodes)),
                                  device=self.lm.device)  # (rows,)
            positions = torch.full((rows,), committed - 1 + search.depths[nodes[0]], device=self.lm.device)
            visible = columns.visible(search, nodes, self.lm.device)
            out, _ = self.lm.forward_masked(tokens, positions, visible, keep=rows)
            self.lm.rollback(self.lm.cache_length - (rows - len(nodes)))  # the padding is stale
            return out[: len(nodes)]  # (f, V)

        draft, self._kept = grow(logits[0], expand, self.tree, k, ctx.sampling, ctx.generator, sampled=self.sample,
                                 prefix_q=prefix_q(ctx))
        self._columns = columns
        return draft

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        if self._columns is not None:  # a tree: gather the expanded part of the accepted path
            columns, base = self._columns, self._committed
            rows: list[int] = []
            for node in ctx.accepted:
                column = columns.column.get(self._kept[node])
                if column is None:
                    break
                rows.append(column - base)
            self.lm.keep_path(base, rows[: max(0, ctx.tokens.shape[0] - 1 - base)])
            self._columns = None
            return
        # The cache holds the C ids committed at propose time, then d_1..d_{k-1}: keep the
        # committed part, never more than all but the newest committed id.
        keep = min(self.lm.cache_length, self._committed + num_accepted, ctx.tokens.shape[0] - 1)
        self.lm.rollback(keep)
