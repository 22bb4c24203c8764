"""A separate, smaller causal LM as the drafter (Leviathan et al. 2023; Chen et al. 2023).

The draft model shares the target's tokenizer, or drafts across vocabularies
(`specdec.drafters.draft_models.translation`: TLI and SLEM). It keeps its own KV cache through the same
adapter as the target, rolled back to the committed prefix after each verify. Sampled drafts
report the processed distribution each token was drawn from; greedy drafts are its argmax.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import PreTrainedModel

from specdec.drafters.draft_models.draft_model_batch import DraftModelBatch
from specdec.drafters.shared.chains import chain_length, chain_uniforms, cut_chain
from specdec.drafters.shared.forms import DraftsThroughForms, Forms
from specdec.drafters.draft_models.translation import (TRANSLATIONS, Translation, common_prefix, load_draft_tokenizer,
                                          resolve_translate, same_vocabulary)
from specdec.drafters.tree_search.dynamic import TreeColumns, TreeSearch, grow, prefix_q, tree_settings
from specdec.protocols import Capability, DraftContext
from specdec.runtime.cache import has_recurrent_state
from specdec.runtime.forward import model_forward
from specdec.runtime.target import CausalLM
from specdec.sampling import chain_sampling, pick
from specdec.types import Draft, Sampling
from specdec.vocab.mapping import NoSharedTokens, VocabMap

__all__ = ["DraftModelDrafter", "DraftModelRow"]

GREEDY = Sampling()  # SLEM's drafts: the draft model's argmax


def _load(model: PreTrainedModel | str | Path, shard: bool = False, quantize: str | None = None) -> PreTrainedModel:
    if isinstance(model, PreTrainedModel):
        if shard:
            raise ValueError("draft-model: shard=true loads the model from its directory; pass a path, or a model "
                             "already loaded with tensor parallelism and shard=false")
        if quantize is not None:
            raise ValueError(f"draft-model: quantize={quantize!r} quantizes a model loaded from its directory, and "
                             "a model passed in is not modified; pass a path, or quantize it first with "
                             "specdec.quantize(model)")
        return model
    if isinstance(model, (str, Path)):
        from specdec.checkpoints import is_gguf, load_causal_lm, resolve_checkpoint
        from specdec.distributed.sharding import in_process_group, world_size

        path = resolve_checkpoint(model, "draft-model model")  # a GGUF file stays a file
        if not is_gguf(path) and not (path / "config.json").is_file():
            raise FileNotFoundError(f"draft-model: {str(path)!r} is not a model directory (no config.json)")
        if shard and not in_process_group():
            raise ValueError("draft-model: shard=true shards the draft model like the target, over the processes "
                             "of a torchrun launch; there is none (launch with torchrun, or drop shard=true)")
        return load_causal_lm(path, tp=world_size() if shard else 1, quantize=quantize)
    raise TypeError(f"draft-model: model= must be a transformers causal LM, a directory, a GGUF file or a hub id, "
                    f"got {model!r}")


def draft_chain(model: Any, cache: Any, logits: torch.Tensor, uniforms: torch.Tensor | None, sampling: Sampling, k: int,
                step: Callable[..., torch.Tensor] | None = None, vocab: VocabMap | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chain of k draft tokens from the draft model's logits [1, V] for the first: each token
    by `pick` (argmax, or a draw at uniforms[i]), each further logits row from a forward of the
    token on `cache` (`step(model, cache, token)`, by default `model_forward`). With `vocab` (a
    draft model with another vocabulary, TLI) each logits row is first laid out in the target's
    vocabulary, restricted to the shared ids (`VocabMap.logits_to_target`), and the token drawn
    there is fed back by its draft id. Returns tokens [k] and q [k, V] (None when greedy), in the
    target's vocabulary."""
    tokens: list[torch.Tensor] = []
    rows: list[torch.Tensor] = []
    for i in range(k):
        if vocab is not None:
            logits = vocab.logits_to_target(logits)  # (1, V_target)
        token, probs = pick(logits, sampling, None if uniforms is None else uniforms[i : i + 1])  # (1,)
        tokens.append(token)
        if probs is not None:
            rows.append(probs)
        if i + 1 < k:  # the logits after the last draft are never needed
            fed = vocab.to_draft(token) if vocab is not None else token  # (1,) in the draft model's vocabulary
            logits = step(model, cache, fed) if step is not None else \
                model_forward(model, cache, fed, 1, (), None, None)[0]  # (1, V)
    return torch.cat(tokens), torch.cat(rows) if rows else None


def translation_full(row: DraftModelRow, k: int) -> bool:
    """Whether a draft across vocabularies would run past the row's static cache."""
    capacity = row.lm.kv.capacity if row.translation is not None and row.lm.kv is not None else None
    if capacity is None:
        return False
    rows = k + 1 + (k * row.tree.top_k if row.tree is not None else k)
    return row.committed + rows > capacity


class DraftModelDrafter(DraftsThroughForms):
    """Drafts with `model` (a causal LM, a checkpoint directory or a hub id).

    A model loaded here from a directory follows the target's device and dtype; a model passed
    in must already be on the target's device.

    tree=True drafts EAGLE-2-style dynamic trees (`specdec.drafters.tree_search.dynamic`): each depth's
    chosen nodes run in one tree-masked forward of the draft model, and after the verify the
    keys and values of the accepted path are gathered into place in its cache (they are exact:
    the draft model saw those very tokens), so nothing is recomputed. Options as for eagle:
    sample=True (the default) draws the draft at temperature > 0 and reports q, a tree's
    siblings distinct (siblings="without_replacement", the default) or i.i.d. (siblings="iid");
    sample=False drafts the argmax chain or the top-k tree. Its cache is static and its
    steps fixed-shape like the target's (k + 1 rows, one row, top_k tree rows), compiled when
    the generation compiles; a chain's feed and its whole draft loop are one step.

    Another tokenizer: a draft model whose tokenizer differs from the target's drafts across
    vocabularies (`specdec.drafters.draft_models.translation`): `translate="tli"` restricts its distribution
    to the shared ids (chains and trees, sampled or argmax), `"slem"` re-tokenises its argmax
    chain's text with the target's tokenizer (chains), `"auto"` (the default) takes TLI when
    sampling or drafting trees and SLEM for greedy chains (and SLEM where the vocabularies share
    no text token). It needs both tokenizers: the target's from
    `specdec.generate(tokenizer=)` (the CLI and the bench pass it), the draft model's as
    `tokenizer=` (an object, a directory or a hub id), else the one saved beside a model loaded
    from a directory. Neither model nor tokenizer is modified.

    quantize="int8" quantizes a model loaded here from its directory (`specdec.quantize`; a model
    passed in is quantized by its owner). With the same tokenizer (or
    without tokenizers and an equal number of output rows) it drafts on the target's ids.
    """

    name: ClassVar[str] = "draft-model"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.STATE, Capability.TREES,
                                                               Capability.CACHE_LENGTH})
    tree_options: ClassVar[dict[str, Any]] = {"tree": True}  # the options that make it draft trees (bench rows)

    def __init__(self, model: PreTrainedModel | str | Path, tree: bool = False, top_k: int = 4,
                 total_tokens: int = 16, depth: int | None = None, value_temperature: float = 1.0,
                 shard: bool = False, sample: bool = True, siblings: str = "without_replacement",
                 translate: str = "auto", tokenizer: Any = None, quantize: str | None = None) -> None:
        self.tree = tree_settings("draft-model", tree, top_k, total_tokens, depth, value_temperature, siblings)
        if not isinstance(sample, bool):
            raise ValueError(f"draft-model: sample must be true or false, got {sample!r}")
        if translate not in TRANSLATIONS:
            raise ValueError(f"draft-model: translate must be one of {', '.join(TRANSLATIONS)}, got {translate!r}")
        self.sample = sample
        self.translate = translate
        # the model as loaded (checks, batches)
        self.lm = CausalLM(_load(model, bool(shard), quantize), role="draft model")
        self._owns_model = not isinstance(model, PreTrainedModel)  # loaded here: follow the target
        self.draft_tokenizer = load_draft_tokenizer(tokenizer, model)  # None when unknown
        self._bridges: dict[tuple[int, str, str], Translation | None] = {}  # (target tokenizer, mode, device)
        self._forms = Forms(lambda: DraftModelRow(self), lambda: DraftModelBatch(self))

    def setup(self, ctx: DraftContext) -> Translation | None:
        """Follow the target's device and dtype (a model loaded here), and return a bridge of this
        generation's to the target's vocabulary (None: it drafts on the target's ids)."""
        if self._owns_model and (self.lm.device, self.lm.dtype) != (ctx.target.device, ctx.target.dtype):
            moved = self.lm.model.to(device=ctx.target.device, dtype=ctx.target.dtype)  # type: ignore[call-arg]
            self.lm = CausalLM(moved, role="draft model")
        if self.lm.device != ctx.target.device:
            raise ValueError(f"draft-model: the draft model is on {self.lm.device}, the target on "
                             f"{ctx.target.device}; move it with .to({str(ctx.target.device)!r})")
        return self._bridge(ctx)  # its vocabulary map on the draft model's device, as moved

    def max_draft_nodes(self, k: int) -> int:
        return k if self.tree is None else self.tree.total_tokens

    @property
    def translation(self) -> Translation | None:
        """Row 0's bridge to the target's vocabulary in the last generation (None: it drafted on the
        target's ids, or has not drafted one prompt yet)."""
        row = self._forms.rows.get(0)
        return None if row is None else row.translation


    def _bridge(self, ctx: DraftContext) -> Translation | None:
        """The generation's bridge to the target's vocabulary, or None when the draft model drafts
        on the target's ids."""
        target_tokenizer, draft_tokenizer = ctx.tokenizer, self.draft_tokenizer
        if target_tokenizer is None or draft_tokenizer is None:
            if self.lm.vocab_size != ctx.vocab_size:
                missing = "the target's (specdec.generate(tokenizer=...))" if target_tokenizer is None else \
                    "the draft model's (tokenizer=, or a model directory that holds one)"
                raise ValueError(
                    f"draft-model: vocabulary mismatch: the draft model has {self.lm.vocab_size} output tokens, "
                    f"the target {ctx.vocab_size}; a draft model with another tokenizer needs both tokenizers, and "
                    f"{missing} is missing")
            return None
        mode = resolve_translate(self.translate, ctx.sampling, self.tree is not None)
        key = (id(target_tokenizer), mode, str(self.lm.device))
        if key not in self._bridges:
            if same_vocabulary(draft_tokenizer, target_tokenizer, self.lm.vocab_size, ctx.vocab_size):
                self._bridges[key] = None
            else:
                self._bridges[key] = self._translation_between(mode, draft_tokenizer, target_tokenizer,
                                                               ctx.vocab_size)
        bridge = self._bridges[key]
        return None if bridge is None else bridge.fresh()

    def _translation_between(self, mode: str, draft_tokenizer: Any, target_tokenizer: Any,
                             target_vocab: int) -> Translation:
        """The bridge for `mode` (`resolve_translate`'s); under "auto" SLEM where TLI's vocabularies
        share no text token."""
        try:
            if mode == "tli":
                return Translation.between("tli", draft_tokenizer, target_tokenizer, self.lm.vocab_size, target_vocab,
                                           self.lm.device)
        except NoSharedTokens:
            if self.translate != "auto":
                raise
            mode = "slem"
        if self.tree is not None:
            raise ValueError("draft-model: tree=True crosses vocabularies by TLI only (SLEM re-tokenises a chain's "
                             "text)" + ("; give translate=tli, or drop tree=true" if self.translate == "slem" else
                                        ", and these vocabularies share no token: drop tree=true"))
        return Translation.between("slem", draft_tokenizer, target_tokenizer, self.lm.vocab_size, target_vocab,
                                   self.lm.device)



class DraftModelRow:
    """One row's drafting on a draft-model cache of its own (the row form, `specdec.drafters.shared.forms`)."""

    def __init__(self, drafter: DraftModelDrafter) -> None:
        self.drafter, self.tree, self.sample = drafter, drafter.tree, drafter.sample
        self.lm = CausalLM(drafter.lm.model, role="draft model")
        self.translation: Translation | None = None  # this generation's, when the vocabularies differ
        self.committed = 0  # the draft model's ids for the committed sequence when the last draft was proposed
        self._max_draft = 0  # the loop's k in this generation
        self._columns: TreeColumns | None = None  # where the last tree's expanded nodes sit
        self._kept: list[int] = []  # search id of each node of the last tree draft
        self._tree_tokens: list[int] = []  # the last tree draft's tokens (target ids), node by node

    @property
    def cache_length(self) -> int:
        return self.lm.cache_length

    def prefill(self, ctx: DraftContext) -> None:
        self.translation = self.drafter.setup(ctx)
        if self.lm.model is not self.drafter.lm.model:  # the drafter moved its model to the target's device
            self.lm = CausalLM(self.drafter.lm.model, role="draft model")
        k = ctx.engine.max_draft
        tree_rows = k * self.tree.top_k if self.tree is not None else k
        capacity = ctx.engine.cache_capacity(extra=k + 1 + tree_rows, static=self.lm.static_eagerly)
        if self.translation is not None and capacity is not None:
            capacity = self.translation.capacity(capacity)
        self.lm.reset(capacity, compile=ctx.engine.compile)
        if self.translation is not None and has_recurrent_state(self.lm.cache):
            raise ValueError(f"draft-model: {type(self.lm.model).__name__} keeps a recurrent state, which cannot go "
                             "back to where a new tokenisation of the committed text departs from the old; across "
                             "tokenizers use a draft model of attention layers")
        self._max_draft = k
        self._columns = None
        ids = self._context_ids(ctx)
        if ids.shape[0] > 1:  # eager: the prompt's length varies
            self.lm.forward(ids[:-1], keep=1, prompt=True)
        if self.translation is not None:
            self.translation.held = ids[:-1].tolist()

    def _context_ids(self, ctx: DraftContext) -> torch.Tensor:
        """The committed sequence in the draft model's ids [T'] (the target's own when they are shared)."""
        if self.translation is None:
            return ctx.tokens
        ids = self.translation.start(ctx.tokens) if self.translation.seen == 0 else \
            self.translation.follow(ctx.tokens)
        return torch.tensor(ids, dtype=torch.long, device=self.lm.device)

    def _feed(self, pending: torch.Tensor) -> torch.Tensor:
        """Run the committed ids not yet in the cache (one after a rejection, two after a full
        acceptance, padded to k + 1 either way: one graph); (1, V)."""
        return self.lm.forward(pending, keep=1, rows=self._feed_rows(pending))[0]

    def _feed_rows(self, pending: torch.Tensor) -> int | None:
        """The fixed rows a feed of `pending` ids is padded to: k + 1 (None, unpadded, for more)."""
        return self._max_draft + 1 if pending.shape[0] <= self._max_draft + 1 else None

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        ids = self._context_ids(ctx)  # (T',) the committed sequence in the draft model's ids
        self.committed = ids.shape[0]
        self._columns = None
        if self.lm.max_positions is not None:  # a draft model with fewer positions drafts less
            k = min(k, self.lm.max_positions - self.committed)
        if translation_full(self, k):  # the draft model's ids outgrew their cache (`Translation.capacity`)
            k = 0
        if k <= 0 or self.committed == 0:  # (a prompt of nothing but ids the draft model has no text for)
            return Draft(ctx.tokens[:0])
        pending = ids[self.lm.cache_length :]  # (>= 1,) committed ids not yet in the cache
        translation = self.translation
        if self.tree is not None:
            obstacle = self.lm.masked_obstacle
            if obstacle is not None:
                raise ValueError(f"draft-model: tree=True needs a draft model that can run tree forwards, but "
                                 f"{type(self.lm.model).__name__} cannot: {obstacle}")
            return self._propose_tree(ctx, k, pending, ids)
        slem = translation is not None and translation.mode == "slem"
        vocab = translation.vocab if translation is not None else None
        n = chain_length(ctx, k)  # a chain the budget's end cuts short: the usual one, cut to k
        if self.lm.max_positions is not None and self.committed + n > self.lm.max_positions:
            n = k
        uniforms = chain_uniforms(ctx, n, self.sample and not ctx.sampling.greedy and not slem)
        sampling = GREEDY if slem else ctx.sampling  # SLEM proposes the draft model's argmax
        rows = self._feed_rows(pending)
        if n == self._max_draft and self.lm.static and rows is not None and (slem or not ctx.sampling.reads_prefix):
            # the usual draft: feed and loop, one step
            tokens, probs = self.lm.fed_chain(draft_chain, pending, rows, n - 1, uniforms, sampling, n, None, vocab)
        else:  # a shorter chain (k=auto), or a model on a dynamic cache: forward by forward
            logits = self._feed(pending)  # (1, V)

            def step(model: object, cache: object, token: torch.Tensor) -> torch.Tensor:
                return self.lm.forward(token, keep=1, rows=1)[0]

            tokens, probs = draft_chain(None, None, logits, uniforms, sampling if slem else chain_sampling(ctx), n,
                                        step, vocab)
        if translation is None:
            return cut_chain(tokens, probs, k)
        fed = tokens[: n - 1] if slem or vocab is None else vocab.to_draft(tokens[: n - 1])
        translation.held = [*ids.tolist(), *fed.tolist()]
        if slem:  # the draft's text in the target's ids, verified by sample-and-match
            drafted = translation.target_ids(tokens.tolist(), ctx.tokens, k)
            return Draft(torch.tensor(drafted, dtype=torch.long, device=ctx.tokens.device))
        return cut_chain(tokens, probs, k)

    def _propose_tree(self, ctx: DraftContext, k: int, pending: torch.Tensor, ids: torch.Tensor) -> Draft:
        """Run the pending ids (the cache then holds all T committed ids), then grow the tree,
        a depth-d node at position T - 1 + d seeing the committed ids and its ancestors. Across
        vocabularies (TLI) the search runs on the target's ids and each node is fed by its
        draft id."""
        assert self.tree is not None
        vocab = self.translation.vocab if self.translation is not None else None
        logits = self._feed(pending)  # (1, V)
        committed = ids.shape[0]
        columns = TreeColumns(committed, self.lm.mask_width, rows=self.tree.top_k)

        def expand(search: TreeSearch, nodes: list[int]) -> torch.Tensor:
            rows = columns.padded(len(nodes))  # one shape per depth: padded to top_k rows
            tokens = torch.tensor([search.tokens[n] for n in nodes] + [0] * (rows - len(nodes)),
                                  device=self.lm.device)  # (rows,)
            if vocab is not None:
                tokens = vocab.to_draft(tokens).clamp(min=0)  # padding: any draft id (its rows are dropped)
            positions = torch.full((rows,), committed - 1 + search.depths[nodes[0]], device=self.lm.device)
            visible = columns.visible(search, nodes, self.lm.device)
            out, _ = self.lm.forward_masked(tokens, positions, visible, keep=rows)
            self.lm.rollback(self.lm.cache_length - (rows - len(nodes)))  # the padding is stale
            out = out[: len(nodes)]  # (f, V)
            return vocab.logits_to_target(out) if vocab is not None else out

        root = vocab.logits_to_target(logits) if vocab is not None else logits
        draft, self._kept = grow(root[0], expand, self.tree, k, ctx.sampling, ctx.generator, sampled=self.sample,
                                 prefix_q=prefix_q(ctx))
        self._columns = columns
        self._tree_tokens = draft.tokens.tolist()
        if self.translation is not None:
            self.translation.held = ids.tolist()
        return draft

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        translation = self.translation
        if self._columns is not None:  # a tree: gather the expanded part of the accepted path
            columns, base = self._columns, self.committed
            rows: list[int] = []
            path: list[int] = []
            for node in ctx.accepted:
                column = columns.column.get(self._kept[node])
                if column is None:
                    break
                rows.append(column - base)
                path.append(self._tree_tokens[node])
            if translation is None:
                self.lm.keep_path(base, rows[: max(0, ctx.tokens.shape[0] - 1 - base)])
                self._columns = None
                return
            self.lm.keep_path(base, rows)
            assert translation.vocab is not None
            translation.held += translation.vocab.to_draft(torch.tensor(path, dtype=torch.long)).tolist()
            self._columns = None
        if translation is not None:
            # keep what the new tokenisation of the committed text still begins with, and commit it
            ids = translation.follow(ctx.tokens)
            keep = min(common_prefix(translation.held, ids), len(ids) - 1, self.lm.cache_length)
            keep = max(keep, 0)
            self.lm.rollback(keep)
            translation.held = translation.held[:keep]
            return
        # The cache holds the C ids committed at propose time, then d_1..d_{k-1}: keep the
        # committed part, never more than all but the newest committed id.
        keep = min(self.lm.cache_length, self.committed + num_accepted, ctx.tokens.shape[0] - 1)
        self.lm.rollback(keep)
