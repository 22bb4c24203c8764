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
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from specdec.runtime.batch_cache import BatchCache
from specdec.runtime.engine import Step
from specdec.runtime.forward import model_forward, prepare_for_compile
from specdec.runtime.linear import CHAIN, visible_layout
from specdec.runtime.target import CausalLM
from specdec.runtime.windows import FULL, layer_masks

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

    def __init__(self, lm: CausalLM, rows: int, capacity: int, compile: bool = False) -> None:
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

    def prefill(self, prompts: list[torch.Tensor], hidden: tuple[int, ...] = ()) -> torch.Tensor | None:
        """Feed every row's ids (prompts[b], any lengths), left-padded to the longest: row b's
        ids take the last len(prompts[b]) of P columns, at positions 0, 1, ...; each sees its own
        earlier ids, a padding column only itself, and no row keeps a padding column. The
        linear-attention layers zero the padding's inputs (transformers' padding mask), so a
        row's recurrent state starts at its first id exactly as when decoded alone. Returns the
        hidden states of the layers `hidden` names, [B, P, len(hidden) * H] (None for none)."""
        device = self.lm.device
        width = max(prompt.shape[0] for prompt in prompts)
        if width == 0:
            return None
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
        return states

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
        with grouped_attention(self.lm.device):
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
