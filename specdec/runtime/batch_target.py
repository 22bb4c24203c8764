"""A causal LM decoding a batch of rows on one static cache with holes (`specdec.generate_batch`).

Rows accept ragged numbers of tokens per step. The columns are a `BatchCache`'s
(`specdec.runtime.batch_cache`): every forward writes its R new columns at one shared column for
all rows; each row keeps the columns of its root and of the nodes it accepted, and leaves the
others as holes that no later query attends to. Each row runs at its own position ids (its
committed length, not the column), so a row reads the same keys and values at the same positions
as when decoded alone, and the holes add only masked terms: its logits are those of batch-1
decoding. A sliding layer's window is measured in those positions (the cache keeps each
column's, `specdec.runtime.windows`), so holes do not eat into it. A linear-attention layer
(GatedDeltaNet) keeps no columns but a state per batch row: a step keeps the state after every
row it feeds, and `keep` takes, per batch row, the state after its own last kept row
(`specdec.runtime.linear`).

Chains and trees take one path: a chain is a chain-shaped tree (`specdec.trees.verify_layout`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from specdec.runtime.batch_cache import BatchCache
from specdec.runtime.engine import Step
from specdec.runtime.forward import model_forward, prepare_for_compile
from specdec.runtime.linear import CHAIN, visible_layout
from specdec.runtime.rows import Feed, Verified
from specdec.runtime.target import CausalLM
from specdec.runtime.tree_logits import TreeLogits
from specdec.runtime.whole_prompt import whole_prompt
from specdec.runtime.windows import FULL, layer_masks
from specdec.trees import chain_parents, depths, verify_layout
from specdec.types import Engine, ExtraRows

__all__ = ["BatchLM", "grouped_attention"]

LINEAR = "linear_attention"  # transformers' layer type of linear-attention layers, a key of its mask mapping
_FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"  # transformers' switch for SDPA's own grouped-query attention


@contextmanager
def grouped_attention(device: torch.device) -> Iterator[None]:
    """On CPU, have transformers' SDPA attention read grouped keys and values as they are
    (`enable_gqa`) under a custom mask too. Otherwise it first copies them out to every query head
    (`repeat_kv`): a copy of the whole static cache, every layer and step, which grows with the
    batch and took 40% of a batch-8 step on the zoo's target. The attention computed is the same.
    Elsewhere (CUDA) the masked grouped kernel may be slower, so nothing changes there."""
    if device.type != "cpu" or os.environ.get(_FORCE_GQA) is not None:
        yield
        return
    os.environ[_FORCE_GQA] = "1"
    try:
        yield
    finally:
        del os.environ[_FORCE_GQA]


class BatchLM:
    """The target of a batch: `rows` rows, a static cache of `capacity` columns.

    `forward` runs ids [B, R] at positions [B, R], row b's query r seeing row b's kept columns
    and the new columns visible[b, r] names; `keep` marks which new columns each row keeps.
    Forwards of a fixed shape (`fixed=True`: the decode steps) run compiled when `compile`.
    """

    def __init__(self, lm: CausalLM, rows: int, capacity: int, compile: bool = False, engine: Engine | None = None
                 ) -> None:
        obstacle = lm.static_obstacle
        if obstacle is not None:
            raise ValueError(f"{type(lm.model).__name__} cannot decode a batch: {obstacle}; decode its prompts one "
                             "by one with specdec.generate")
        self.lm, self.capacity = lm, capacity
        self.columns = BatchCache(lm.model, rows, capacity, lm.device)
        self.kv = self.columns.kv
        if compile:
            prepare_for_compile(lm.model)
        self._step = Step(model_forward, f"the {type(lm.model).__name__} batched forward", compile, lm.model)
        self.engine = engine if engine is not None else Engine()  # the generation's shapes, for `verify`
        self._layouts: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # a chain's, per length
        self._drafts: list[int] = []  # the columns `draft_step` keeps until `drop_drafts`

    @property
    def width(self) -> int:
        """Columns written so far (kept or holes)."""
        return self.columns.width

    @property
    def rows(self) -> int:
        return self.columns.rows

    @property
    def valid(self) -> torch.Tensor:
        """BoolTensor [B, C]: the columns each row keeps."""
        return self.columns.valid

    @property
    def base(self) -> int:
        """The first column of the last forward."""
        return self.columns.base

    @property
    def compiled(self) -> bool:
        return self._step.compiled

    def kept(self) -> torch.Tensor:
        """LongTensor [B]: the columns each row keeps."""
        return self.columns.kept()

    @property
    def tree_obstacle(self) -> str | None:
        """None: a batch's verify takes trees (a model that cannot is refused at construction)."""
        return None

    @property
    def masked_obstacle(self) -> str | None:
        """Why a verify cannot take a drafter's extra rows (None: it can)."""
        if self.kv.recurrent:
            return ("its linear-attention layers continue one row from one earlier row, and an extra row sees "
                    "several")
        return None

    def prefill(self, prompts: Sequence[torch.Tensor], hidden: tuple[int, ...] = ()) -> list[torch.Tensor | None]:
        """Feed every row's ids (prompts[b], any lengths), left-padded to the longest: row b's
        ids take the last len(prompts[b]) of P columns, at positions 0, 1, ...; each sees its own
        earlier ids, a padding column only itself, and no row keeps a padding column. The
        linear-attention layers zero the padding's inputs (transformers' padding mask), so a
        row's recurrent state starts at its first id exactly as when decoded alone. Returns each
        row's hidden states of the layers `hidden` names, [len(prompts[b]), len(hidden) * H]
        (None for none)."""
        device = self.lm.device
        width = max(prompt.shape[0] for prompt in prompts)
        if width == 0:
            empty = torch.empty(0, len(hidden) * self.lm.hidden_size, dtype=self.lm.dtype, device=device)
            return [empty if hidden else None for _ in prompts]
        lengths = torch.tensor([prompt.shape[0] for prompt in prompts], device=device)  # (B,)
        column = torch.arange(width, device=device)  # (P,)
        start = width - lengths  # (B,) each row's first real column
        real = column[None] >= start[:, None]  # (B, P)
        ids = torch.stack([torch.cat([prompt.new_zeros(width - prompt.shape[0]), prompt]) for prompt in prompts])
        positions = (column[None] - start[:, None]).clamp(min=0)  # (B, P)
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        eye = torch.eye(width, dtype=torch.bool, device=device)
        visible = (causal[None] & real[:, None, :]) | (eye[None] & ~real[:, :, None])  # (B, P, P)
        _, states = self.forward(ids, positions, visible, hidden, fixed=False, keep=1, padding=real)
        self.columns.keep_new(real)
        return [None if states is None else states[b, width - prompt.shape[0] :] for b, prompt in enumerate(prompts)]

    def verify(self, feeds: Sequence[Feed | None], layers: tuple[int, ...]) -> Verified:
        """One forward over every slot's root and draft (`lay_out`); idle slots (None) feed padding."""
        engine = self.engine
        live = [feed for feed in feeds if feed is not None]
        tree = any(feed.tree for feed in live)
        longest = max((feed.draft.shape[0] for feed in live), default=0)
        width = engine.tree_rows(longest) if tree else engine.chain_rows(longest)  # root included
        rows = width + (engine.extra_rows if tree else 0)
        ids, positions, visible = self._lay_out(feeds, width, rows)
        # a tree's rows reach depth 1 + its deepest node's (padding nodes hang off the root: 2); at
        # least 1 + k, so the steps of one decode share one compiled graph
        depth = 1 + max([1, engine.max_draft] + [_reached(feed) for feed in live]) if tree else None
        logits, states = self.forward(ids, positions, visible, layers, depth=depth)  # (S, R, V), (S, R, m * H)
        self._roots = [None if feed is None else feed.committed.shape[0] - 1 for feed in feeds]
        head = self.lm.lm_head
        out = [None if feed is None else TreeLogits(logits.new_empty(0, 0), head, logits[s, : feed.draft.shape[0] + 1])
               for s, feed in enumerate(feeds)]
        extra = [None if feed is None or feed.extra is None else logits[s, width : width + _extra_count(feed)]
                 for s, feed in enumerate(feeds)]
        return Verified(out, logits, [None if states is None else states[s] for s in range(len(feeds))], extra)

    def commit(self, paths: Sequence[Sequence[int] | None]) -> None:
        """Slot s keeps the verify rows paths[s] of the last verify (None: an idle slot keeps none)."""
        rows = [s for s, path in enumerate(paths) if path is not None for _ in path]
        columns = [column for path in paths if path is not None for column in path]
        self.keep(rows, columns)

    def cache_length(self, slot: int) -> int:
        """Columns slot s keeps."""
        return int(self.valid[slot].sum())

    def tampered(self) -> str | None:
        """None: a drafter cannot reach a batch's cache (ctx.target runs a cache of its own)."""
        return None

    def _lay_out(self, feeds: Sequence[Feed | None], width: int, rows: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each slot's R = `rows` ids, positions and visibility among them: [S, R], [S, R], [S, R, R].
        A live slot feeds its root and its draft (a tree padded to `width` rows, then its extra rows
        padded to the declared count); an idle slot feeds pad ids seeing themselves."""
        device = self.lm.device
        ids, positions, visible = [], [], []
        idle = torch.eye(rows, dtype=torch.bool, device=device), torch.zeros(rows, dtype=torch.long, device=device)
        for feed in feeds:
            if feed is None:
                ids.append(torch.zeros(rows, dtype=torch.long, device=device))
                seen, offsets = idle
            else:
                n = feed.draft.shape[0]
                extra = None if feed.extra is None else feed.extra.padded(rows - width)
                seen, offsets = self._layout(feed.parents, n, width, extra, rows)
                parts = [feed.committed[-1:], feed.draft, feed.draft.new_zeros(width - n - 1)]
                if extra is not None:
                    parts.append(extra.tokens)
                used = width + (0 if extra is None else extra.tokens.shape[0])
                ids.append(torch.cat(parts + [feed.draft.new_zeros(rows - used)]))
                offsets = offsets + (feed.committed.shape[0] - 1)
            positions.append(offsets)
            visible.append(seen)
        return torch.stack(ids), torch.stack(positions), torch.stack(visible)

    def _layout(self, parents: list[int] | None, n: int, width: int, extra: ExtraRows | None, rows: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Visibility [R, R] and position offsets [R] of one slot's draft (`verify_layout`), padded to
        `rows` with rows that see only themselves; a chain's is kept per length."""
        key = (n, width, rows)
        if parents is None and extra is None and key in self._layouts:
            return self._layouts[key]
        device = self.lm.device
        seen, offsets = verify_layout(parents if parents is not None else chain_parents(n), width, extra, device)
        if seen.shape[0] < rows:
            pad = rows - seen.shape[0]
            full = torch.eye(rows, dtype=torch.bool, device=device)
            full[: seen.shape[0], : seen.shape[0]] = seen
            seen, offsets = full, torch.cat([offsets, offsets.new_zeros(pad)])
        if parents is None and extra is None:
            self._layouts[key] = (seen, offsets)
        return seen, offsets

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, hidden: tuple[int, ...] = (),
                fixed: bool = True, keep: int | None = None, depth: int | None = None,
                padding: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids, positions [B, R]; visible [B, R, R] among the new rows. Returns the logits of the
        last `keep` rows (all by default) [B, keep, V] and the hidden states of the layers `hidden`
        names, [B, R, len(hidden) * H] (None for none).

        On a target with linear-attention layers a step keeps every row's state until `keep`
        commits each batch row's path: a chain (each row continues the row before it) unless
        `depth` is given, then a tree of at most that depth whose rows continue the latest row
        they see. `padding` [B, R] (True = a real id) makes it a prefill instead, committed at once."""
        batch, rows = ids.shape
        self.columns.begin(rows)  # compacts when the columns run out
        recurrent = self.kv.recurrent
        layout = None if padding is not None or not recurrent else CHAIN if depth is None else \
            visible_layout(visible, self.kv.kernel, depth)
        self.kv.reserve(rows, layout, batch)
        seen = self.columns.seen(visible)  # (B, R, C)
        if self.lm.learned_positions and self.lm.max_positions:
            positions = positions.clamp(max=self.lm.max_positions - 1)  # padding rows may run past the table
        # (B, 1, R, C) additive, one per kind of layer where kinds mix (sliding layers: their window too)
        mask = layer_masks(self.kv.attention, seen, positions, self.kv.key_positions(positions), self.lm.dtype)
        if recurrent:  # the linear-attention layers' own entry: a prefill's padding mask [B, R], else none
            mask = {**(mask if isinstance(mask, dict) else {FULL: mask}), LINEAR: padding}
        args = (self.kv.cache, ids, rows if keep is None else keep, hidden, mask, positions)
        # a first write allocates the cache (never compiled); a prefill's shape varies
        compiled = fixed and self.kv.initialized
        prompt = whole_prompt() if padding is not None else nullcontext()  # a prefill: compared with nothing
        with grouped_attention(self.lm.device), prompt:
            logits, states = self._step(*args) if compiled else model_forward(self.lm.model, *args)
        self.kv.advanced(rows, positions)
        return logits, states

    def keep(self, rows: list[int], columns: list[int]) -> None:
        """Row rows[i] keeps the new column base + columns[i] of the last forward (a step's); on
        a target with linear-attention layers each row's state becomes that after its last kept
        column, the columns it keeps being a path from its first."""
        if self.kv.recurrent:  # checks the paths before anything changes
            paths: list[list[int]] = [[] for _ in range(self.rows)]
            for row, column in zip(rows, columns):
                paths[row].append(column)
            self.kv.commit_rows([sorted(path) for path in paths])
        self.columns.keep(rows, columns)

    def draft_rows(self, rows: int) -> None:
        """Ready `rows` draft rows (`draft_step`): compact first when they would not fit, so that no
        compaction moves the columns while the drafts hold some."""
        self.columns.begin(rows)
        self._drafts = []

    def draft_step(self, model: nn.Module, ids: torch.Tensor, positions: torch.Tensor,
                   step: Step | None = None, args: tuple[Any, ...] = ()) -> Any:
        """One draft row per batch row through `model`, a view of this target's own layers that
        shares its cache (self-speculation): ids [B] at positions [B], row b seeing its kept columns
        and its draft rows so far. The new column is kept until `drop_drafts`. Runs `step` (a
        `Step` of `fn(model, cache, ids [B, 1], mask, positions [B, 1], *args)`) when given, else
        the forward, returning the logits of the row [B, V]."""
        self.columns.begin(1)
        self.kv.reserve(1, None, ids.shape[0])
        positions = positions[:, None]  # (B, 1)
        if self.lm.learned_positions and self.lm.max_positions:
            positions = positions.clamp(max=self.lm.max_positions - 1)
        seen = self.columns.seen(torch.ones(ids.shape[0], 1, 1, dtype=torch.bool, device=ids.device))  # (B, 1, C)
        mask = layer_masks(self.kv.attention, seen, positions, self.kv.key_positions(positions), self.lm.dtype)
        with grouped_attention(self.lm.device):
            if step is not None:
                out = step(self.kv.cache, ids[:, None], mask, positions, *args)
            else:
                out = model_forward(model, self.kv.cache, ids[:, None], 1, (), mask, positions)[0][:, -1]
        self.kv.advanced(1, positions)
        self.kv.retreat(self.kv.length)  # every layer's length, the skipped layers' too, at the new width
        self.columns.keep(list(range(self.rows)), [0] * self.rows)
        self._drafts.append(self.columns.base)
        return out

    def drop_drafts(self) -> None:
        """Give back every column `draft_step` kept: holes from now on."""
        for column in self._drafts:
            self.columns.release(list(range(self.rows)), [column] * self.rows)
        self._drafts = []

    def release(self, rows: list[int], columns: list[int]) -> None:
        """Row rows[i] gives back column columns[i] (absolute): a drafter's draft entries, kept
        while it drafted and dropped after the verify rejected them (attention layers only)."""
        self.columns.release(rows, columns)

    def compact(self) -> None:
        """Move every row's kept columns to the front of its columns, in order; the holes go."""
        self.columns.compact()

    def select(self, rows: list[int]) -> None:
        """Keep only the batch rows `rows`, in that order (the others finished)."""
        self.columns.select(rows)


def _reached(feed: Feed) -> int:
    """The depth a feed's draft reaches: its deepest node's, or a chain's length."""
    return max(depths(feed.parents), default=0) if feed.parents is not None else feed.draft.shape[0]


def _extra_count(feed: Feed) -> int:
    """The extra rows a feed carries, padding included."""
    return 0 if feed.extra is None else feed.extra.tokens.shape[0]
