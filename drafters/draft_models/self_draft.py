"""The target drafting for itself with a subset of its own decoder layers, over its own committed
KV cache: no second model (Zhang et al. 2023, "Draft & Verify: Lossless Large Language Model
Acceleration via Self-Speculative Decoding"; Xia et al. 2025, "SWIFT: On-the-Fly Self-Speculative
Decoding for LLM Inference Acceleration"; early exit as in Elhoushi et al. 2024, "LayerSkip").

A draft feeds the last committed id, then each draft token, through the kept layers only
(`specdec.drafters.draft_models.layer_view`), at positions T - 1, T, ... of the target's cache: the kept
layers read the full model's keys and values of every committed position and write the draft's
rows past them; the rows are dropped before `propose` returns, exactly as a verify's rejected
rows are, so the committed positions are never changed (the cache counts the rows as they are
written, so a step that fails to compile reruns eagerly at its own row). Every forward gets
explicit positions and a 4D mask: a skipped layer's slot does not grow, so neither may be read
from the cache. In batch-1 decoding column c of the cache holds position c, so a sliding layer's
window is measured on the columns.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

from specdec.drafters.shared.chains import chain_uniforms
from specdec.drafters.draft_models.layer_search import LayerChoice, cached_search, stdlib_calibration
from specdec.drafters.draft_models.layer_view import LayerView, crop_layers, layer_view, num_layers
from specdec.protocols import Capability, DraftContext, Rows
from specdec.drafters.shared.batch_chains import row_drafts, row_uniforms
from specdec.runtime.batch_target import BatchLM
from specdec.runtime.engine import Step
from specdec.runtime.forward import model_forward
from specdec.runtime.target import CausalLM
from specdec.runtime.windows import Attention, layer_masks
from specdec.sampling import PrefixPicker, RowsPicker, chain_sampling, pick
from specdec.types import Draft, Sampling

__all__ = ["RowPlan", "SelfDrafter", "parse_layers", "self_chain", "self_step"]

_LAYERS_FORM = ("'auto', a list of kept layer indices, or a string of indices and inclusive ranges joined by '+' "
                "(e.g. '0-5+9+11')")


def parse_layers(layers: Sequence[int] | str | int | None) -> tuple[int, ...] | None:
    """The kept layer indices `layers` names (None for 'auto' or None): a list of ints, one int, or
    the CLI form '0-5+9+11' (ranges inclusive). Raises ValueError naming the bad value."""
    if layers is None or layers == "auto":
        return None
    if isinstance(layers, bool):
        raise ValueError(f"self: layers must be {_LAYERS_FORM}, got {layers!r}")
    if isinstance(layers, int):
        return (layers,)
    if isinstance(layers, str):
        indices: list[int] = []
        for part in layers.replace(" ", "").split("+"):
            low, dash, high = part.partition("-")
            if not low.isdigit() or dash and not high.isdigit() or dash and int(high) < int(low):
                raise ValueError(f"self: layers must be {_LAYERS_FORM}, got {layers!r} (bad part {part!r})")
            indices.extend(range(int(low), int(high) + 1) if dash else [int(low)])
        layers = indices
    if not isinstance(layers, Sequence) or not layers or \
            any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers):
        raise ValueError(f"self: layers must be {_LAYERS_FORM}, got {layers!r}")
    if len(set(layers)) != len(layers):
        raise ValueError(f"self: layers names a layer twice: {list(layers)!r}")
    return tuple(sorted(layers))


@dataclass(frozen=True)
class RowPlan:
    """The fixed shape of a draft row's step: `columns` the static cache's capacity (None: a
    dynamic cache, whose mask grows); the model's kinds of attention layer; `table` the last entry
    of a learned position table (None for rotary models); the mask dtype."""

    columns: int | None
    kinds: Attention
    table: int | None
    dtype: torch.dtype


def _view_step(view: PreTrainedModel, cache: Cache, token: torch.Tensor, column: torch.Tensor, plan: RowPlan
               ) -> torch.Tensor:
    """One forward of token [1] through the view, written at cache column `column` (0-d), seeing
    columns 0..column; the next-token logits (1, V)."""
    position = column.clamp(max=plan.table) if plan.table is not None else column  # 0-d
    width = plan.columns if plan.columns is not None else int(column) + 1
    columns = torch.arange(width, device=token.device)  # (W,)
    visible = (columns <= column)[None, None]  # (1, 1, W)
    keys = columns[None] if plan.kinds.sliding else None  # (1, W): column c holds position c
    mask = layer_masks(plan.kinds, visible, position.reshape(1, 1), keys, plan.dtype)  # (1, 1, 1, W) or by kind
    return model_forward(view, cache, token, 1, (), mask, position.reshape(1, 1))[0]


def self_step(view: PreTrainedModel, cache: Cache, column: torch.Tensor, token: torch.Tensor,
              uniform: torch.Tensor | None, sampling: Sampling | PrefixPicker, plan: RowPlan
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One draft token: token [1] through the view at cache column `column` (0-d), then `pick` from
    its logits (the argmax, or a draw at uniform [1]). Returns (token [1], q [1, V] or None when greedy)."""
    logits = _view_step(view, cache, token, column, plan)  # (1, V)
    return pick(logits, sampling, uniform)


def self_chain(step: Callable[..., tuple[torch.Tensor, torch.Tensor | None]], base: torch.Tensor,
               first: torch.Tensor, uniforms: torch.Tensor | None, rows: int, advance: Callable[[], None]
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chain of `rows` draft tokens: `step(column, token, uniform)` (`self_step` on a view and a
    cache) on the last committed id first [1] at column base (0-d, the committed cache length), then
    on each draft token at the next column, `advance()` after each. The tokens never leave the
    device. Returns tokens [rows] and q [rows, V] (None when greedy)."""
    token = first  # (1,)
    tokens: list[torch.Tensor] = []
    probs: list[torch.Tensor] = []
    for i in range(rows):
        token, q = step(base + i, token, None if uniforms is None else uniforms[i : i + 1])  # (1,), (1, V)
        advance()
        tokens.append(token)
        if q is not None:
            probs.append(q)
    return torch.cat(tokens), torch.cat(probs) if probs else None


_Served = tuple[LayerView, dict[bool, Step]]  # a view and its draft steps, by whether they compile


def batch_self_step(view: PreTrainedModel, cache: Cache, ids: torch.Tensor, mask: Any, positions: torch.Tensor,
                    uniforms: torch.Tensor | None, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One draft row of every batch row: ids [B, 1] through the view at positions [B, 1] under `mask`,
    then `pick` from its logits (the argmax, or a draw at uniforms [B]). Returns (tokens [B], q [B, V]
    or None when greedy)."""
    logits = model_forward(view, cache, ids, 1, (), mask, positions)[0][:, -1]  # (B, V)
    return pick(logits, sampling, uniforms)


class SelfDrafter:
    """Drafts with the target's own layers, a subset of them, over its own cache.

    layers: the KEPT layer indices: 'auto' (default: searched, `specdec.drafters.draft_models.layer_search`),
        a list of ints, or the CLI form '0-5+9+11' (inclusive ranges joined by '+').
    exit_layer: N keeps layers [0, N), then the final norm and LM head (early exit, for
        checkpoints trained for it); exclusive with layers.
    sample: True draws the draft at temperature > 0 and reports q; False drafts the argmax.
    tokenizer: the target's tokenizer (an object, or a directory or hub id to load; else
        ctx.tokenizer when the caller gave one), for the search's calibration text: the standard
        library's held-out source; without one the search calibrates on the prompt.
    calibration_tokens: how many calibration ids the search reads.

    On a static cache each draft row (the view's forward of one id and its pick) is one
    fixed-shape step, compiled when the generation compiles: one graph the size of a forward of the
    kept layers, replayed k times per draft, each token fed to the next on the device. (Unrolled
    into one graph, as the draft model's loop is, the k rows of a view of most of the target's
    layers make a graph k times a target forward's, which took minutes to compile per cache size.)
    A dynamic cache, prefix-reading settings and a cache not
    yet written draft eagerly. A batch (`specdec.generate_batch`) drafts every row at once over the
    batch's own cache: one forward of the kept layers per draft depth, one compiled graph per batch
    shape (`BatchLM.draft_step`).
    """

    name: ClassVar[str] = "self"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.STATE})

    def __init__(self, layers: Sequence[int] | str | int | None = None, exit_layer: int | None = None,
                 sample: bool = True, tokenizer: Any = None, calibration_tokens: int = 512) -> None:
        self.layers = parse_layers(layers)
        if exit_layer is not None:
            if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) or exit_layer < 1:
                raise ValueError(f"self: exit_layer must be an int >= 1 (layers [0, N) run), got {exit_layer!r}")
            if layers is not None:
                raise ValueError(f"self: layers={layers!r} and exit_layer={exit_layer!r} are exclusive; give one")
        if not isinstance(sample, bool):
            raise ValueError(f"self: sample must be true or false, got {sample!r}")
        if isinstance(calibration_tokens, bool) or not isinstance(calibration_tokens, int) or calibration_tokens < 2:
            raise ValueError(f"self: calibration_tokens must be an int >= 2, got {calibration_tokens!r}")
        self.exit_layer, self.sample, self.tokenizer = exit_layer, sample, tokenizer
        self.calibration_tokens = calibration_tokens
        self.view: LayerView | None = None  # the view of the current generation's target
        self.choice: LayerChoice | None = None  # the search's answer, when layers were searched
        # per target model (weakly): its views by kept layers, each with its draft steps (by whether they compile)
        self._views: weakref.WeakKeyDictionary[PreTrainedModel, dict[tuple[int, ...], _Served]] = \
            weakref.WeakKeyDictionary()
        self._steps: dict[Any, Step] = {}  # the current view's: by whether they compile (and batched)
        self._batch: BatchLM | None = None  # the batch's target, when the generation decodes several prompts
        self._lm: CausalLM | None = None
        self._calibration: tuple[Any, torch.Tensor] | None = None  # (tokenizer, its calibration ids)

    def prefill(self, rows: Rows) -> None:
        ctx = rows[min(rows)]  # every row's target and settings
        lm = ctx.target
        self._batch = ctx.target_rows if isinstance(ctx.target_rows, BatchLM) else None
        self._check_target(ctx)
        kept = self._kept(ctx)
        views = self._views.setdefault(lm.model, {})
        if kept not in views:
            views[kept] = (layer_view(lm.model, kept), {})
        (self.view, self._steps), self._lm = views[kept], lm

    def _check_target(self, ctx: DraftContext) -> None:
        lm = ctx.target
        obstacle = (self._batch if self._batch is not None else lm).masked_obstacle
        if obstacle is not None:
            raise ValueError(f"self: {type(lm.model).__name__} cannot self-draft: its draft forwards need explicit "
                             f"masks and positions: {obstacle}")
        if self._batch is None and lm.cache_length != ctx.tokens.shape[0] - 1:
            raise ValueError(f"self: the target's cache holds {lm.cache_length} positions, not the "
                             f"{ctx.tokens.shape[0] - 1} committed ones this drafter drafts after")

    def _kept(self, ctx: DraftContext) -> tuple[int, ...]:
        """The kept layers: the explicit ones, [0, exit_layer), or the search's, checked against the model."""
        model = ctx.target.model
        total = num_layers(model)
        if self.exit_layer is not None:
            if self.exit_layer > total:
                raise ValueError(f"self: exit_layer={self.exit_layer} but {type(model).__name__} has {total} layers; "
                                 f"give 1..{total}")
            return tuple(range(self.exit_layer))
        if self.layers is not None:
            outside = [i for i in self.layers if i >= total]
            if outside:
                raise ValueError(f"self: layers {list(self.layers)} name {outside}, but {type(model).__name__} has "
                                 f"{total} layers (0..{total - 1})")
            return self.layers
        tokenizer = self._tokenizer(ctx)
        if tokenizer is not None:
            if self._calibration is None or self._calibration[0] is not tokenizer:
                self._calibration = (tokenizer, stdlib_calibration(tokenizer, self.calibration_tokens))
            ids = self._calibration[1]
            source = f"stdlib held-out source, {self.calibration_tokens} tokens of {type(tokenizer).__name__}"
            if ids.numel() == 0 or int(ids.max()) >= ctx.vocab_size:
                raise ValueError(f"self: the tokenizer {type(tokenizer).__name__} gave ids outside the target's "
                                 f"vocabulary of {ctx.vocab_size}; pass the target's own tokenizer")
        else:
            ids, source = ctx.tokens[-self.calibration_tokens :], "the prompt"
        self.choice = cached_search(model, ids, max(1, ctx.engine.max_draft), source)
        return self.choice.kept

    def _tokenizer(self, ctx: DraftContext) -> Any:
        """The calibration's tokenizer: the option (a directory or hub id is loaded once), else the caller's."""
        if isinstance(self.tokenizer, (str, Path)):
            from transformers import AutoTokenizer

            try:
                self.tokenizer = AutoTokenizer.from_pretrained(str(self.tokenizer))
            except (OSError, ValueError) as error:
                raise ValueError(f"self: cannot load the tokenizer {str(self.tokenizer)!r}: {error}") from error
        return self.tokenizer if self.tokenizer is not None else getattr(ctx, "tokenizer", None)

    def commit(self, rows: Rows, accepted: Mapping[int, int]) -> None:
        """Nothing to roll back: the draft's rows left the target's cache before `propose` returned."""

    def propose(self, rows: Rows, k: Mapping[int, int]) -> dict[int, Draft]:
        if self._batch is not None:
            return self._propose_batch(self._batch, rows, k)
        return {row: self._propose(ctx, k[row]) for row, ctx in rows.items()}

    def _propose_batch(self, batch: BatchLM, rows: Rows, k: Mapping[int, int]) -> dict[int, Draft]:
        """Every row's chain over the batch's own cache: one forward of the kept layers per draft
        depth for all rows, each row at its own positions seeing its kept columns and its draft rows
        (`BatchLM.draft_step`), the draft rows given back before it returns; each row draws at the
        uniforms it draws alone, so it drafts what it drafts alone."""
        first = rows[min(rows)]
        n, view = max(k.values()), self.view
        if view is None or n <= 0:
            return {row: Draft(ctx.tokens[:0]) for row, ctx in rows.items()}
        device = first.tokens.device
        slots = {row: ctx.slot for row, ctx in rows.items()}
        ids = torch.zeros(batch.rows, dtype=torch.long, device=device)  # (B,) idle slots feed id 0, seen by none
        positions = torch.zeros(batch.rows, dtype=torch.long)  # (B,)
        for row, ctx in rows.items():
            ids[slots[row]] = ctx.tokens[-1]
            positions[slots[row]] = ctx.tokens.shape[0] - 1
        positions = positions.to(device)
        uniforms = row_uniforms(rows, slots, batch.rows, n, self.sample and not first.sampling.greedy, device)
        pickers = RowsPicker({slots[row]: PrefixPicker(ctx) for row, ctx in rows.items()}) \
            if first.sampling.reads_prefix else None
        step = self._batch_step(view, first.engine.compile) if pickers is None else None
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        batch.draft_rows(n)
        try:
            for i in range(n):
                uniform = None if uniforms is None else uniforms[:, i]
                if step is not None:
                    ids, q = batch.draft_step(view.model, ids, positions + i, step, (uniform, first.sampling))
                else:  # each row picks from its own prefix, on the host
                    ids, q = pick(batch.draft_step(view.model, ids, positions + i), pickers, uniform)  # (B,), (B, V)
                tokens.append(ids)
                if q is not None:
                    probs.append(q)
        finally:
            batch.drop_drafts()
        return row_drafts(rows, list(rows), slots, k, torch.stack(tokens, dim=1),
                          torch.stack(probs, dim=1) if probs else None)

    def _batch_step(self, view: LayerView, compile: bool) -> Step:
        key = ("batch", compile)
        if key not in self._steps:
            name = f"the {type(view.model).__name__} batched self-draft step (layers {view.model.specdec_kept_layers})"
            self._steps[key] = Step(batch_self_step, name, compile, view.model)
        return self._steps[key]

    def _propose(self, ctx: DraftContext, k: int) -> Draft:
        lm, view = ctx.target, self.view
        if view is None or k <= 0:
            return Draft(ctx.tokens[:0])
        kv = lm.kv
        assert kv is not None
        committed = ctx.tokens.shape[0] - 1  # the cache holds every committed id but the last
        if lm.cache_length != committed:
            raise ValueError(f"self: the target's cache holds {lm.cache_length} positions, not the {committed} "
                             "committed ones")
        kv.reserve(k)  # the draft's rows must fit a static cache
        uniforms = chain_uniforms(ctx, k, self.sample and not ctx.sampling.greedy)  # as many, whatever k
        table = lm.max_positions - 1 if lm.learned_positions and lm.max_positions else None
        plan = RowPlan(kv.capacity, kv.attention, table, lm.dtype)
        base = torch.tensor(committed).to(lm.device, non_blocking=True)  # (): a tensor, so one graph serves every row
        self._lm = lm
        if kv.static and kv.initialized and not ctx.sampling.reads_prefix:  # fixed shapes: one (compiled) step per row
            compiled = self._step(view, ctx.engine.compile)
            sampling: Sampling | PrefixPicker = ctx.sampling

            def step(column: torch.Tensor, token: torch.Tensor, uniform: torch.Tensor | None) -> Any:
                return compiled(kv.cache, column, token, uniform, sampling, plan)
        else:  # a first write, a dynamic cache or prefix-reading settings: eagerly
            sampling = chain_sampling(ctx)

            def step(column: torch.Tensor, token: torch.Tensor, uniform: torch.Tensor | None) -> Any:
                return self_step(view.model, kv.cache, column, token, uniform, sampling, plan)
        try:
            tokens, probs = self_chain(step, base, ctx.tokens[-1:].clone(), uniforms, k, lambda: kv.advanced(1))
        finally:
            self._drop_rows(committed)
        return Draft(tokens, probs)

    def _step(self, view: LayerView, compile: bool) -> Step:
        if compile not in self._steps:
            name = f"the {type(view.model).__name__} self-draft step (layers {view.model.specdec_kept_layers})"
            self._steps[compile] = Step(self_step, name, compile, view.model, restore=lambda: self._drop_rows(None))
        return self._steps[compile]

    def _drop_rows(self, committed: int | None) -> None:
        """Drop the draft's rows: back to `committed` positions (None: to the rows the cache counts,
        after a failed compiled step, whose own row is then written again)."""
        lm = self._lm
        if lm is None or lm.kv is None:
            return
        length = lm.cache_length if committed is None else committed
        if not lm.kv.static:
            crop_layers(lm.kv.cache, length)  # the view grew only the layers it ran
        lm.discard(length)
