"""KV caches of transformers models: static and dynamic caches, their length, rollback and the
gathering of a tree's accepted path. (What a model can run on: `specdec.runtime.obstacles`;
snapshots of a dynamic cache's recurrent state: `specdec.runtime.replay`.)

All knowledge of transformers' cache classes lives here (transformers 5.x: `DynamicCache.crop`
takes a negative count of tokens to remove; a `StaticLayer` writes at its `cumulative_length`).

- Static (`KV` with a capacity): every attention layer, full or sliding, is preallocated for
  `capacity` positions. A forward writes its rows at the cache's length; a rollback only sets the
  length: nothing is copied, the stale entries beyond it are masked (by causality, or by a tree's
  mask) and overwritten by the next forward, as in gpt-fast. Fixed shapes, so compiled graphs and
  CUDA graphs can replay. A sliding layer's window is enforced by the mask
  (`specdec.runtime.windows`), for which the cache keeps the position each column holds. A
  GatedDeltaNet layer keeps its state per row fed since the last commit
  (`specdec.runtime.linear.LinearStates`): a rollback commits the row it lands on.
- Dynamic (`KV` without one): transformers' `DynamicCache`, grown by concatenation and cropped.
  With `activate_past_recording`, sliding-window layers and the conv states of linear-attention
  layers keep what a crop needs, so `crop` cuts them back exactly. The recurrent state of a
  linear-attention layer (GatedDeltaNet, SSM) is a running sum that no crop can undo: a snapshot
  copies it (fixed size) before a forward, and a restore crops everything else and copies it
  back; the caller replays the ids in between. Models with recurrent layers other than
  GatedDeltaNet (Mamba2) always take the dynamic cache (`specdec.runtime.obstacles.static_obstacle`
  says why); there sliding layers keep transformers' window-sized ring.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import transformers
from transformers import DynamicCache, PreTrainedModel, StaticCache
from transformers.cache_utils import (Cache, LinearAttentionCacheLayerMixin, LinearAttentionLayer, StaticLayer,
                                      StaticSlidingWindowLayer, get_layer_types_and_kwargs)

from specdec.runtime.linear import LinearStates, TreeLayout, linear_dims, serve_linear_layers
from specdec.runtime.windows import SLIDING, attention_kinds

__all__ = ["KV", "cache_length", "check_transformers", "crop_cache", "gather_columns", "gather_positions",
           "has_recurrent_state", "new_cache", "select_batch", "set_static_length", "static_cache_bytes"]

MINIMUM_TRANSFORMERS = (5, 24)  # forwards take `cache=` from 5.24 on


def check_transformers() -> None:
    """Raise if the installed transformers predates the `cache=` forward argument."""
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    if (major, minor) < MINIMUM_TRANSFORMERS:
        raise RuntimeError(f"specdec needs transformers >= 5.24 (forwards take `cache=`), found "
                           f"{transformers.__version__}; pip install 'transformers>=5.24,<5.25'")


def new_cache(model: PreTrainedModel) -> Cache:
    """An empty dynamic cache laid out for `model` (per-layer types from its config), recording
    the past so that attention layers and conv states crop exactly."""
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()
    return cache


def has_recurrent_state(cache: Cache) -> bool:
    """Whether the cache has linear-attention layers, whose state a crop alone cannot roll back."""
    return any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers)


def cache_length(cache: Cache | None) -> int:
    """Tokens held by the cache (0 for no cache); on a pipeline stage, those of the first layer it runs."""
    if cache is None:
        return 0
    for index, layer in enumerate(cache.layers):
        if getattr(layer, "is_initialized", True) and getattr(layer, "keys", None) is not None:
            return int(cache.get_seq_length(index))
    return int(cache.get_seq_length())


def crop_cache(cache: Cache, length: int) -> None:
    """Cut the attention layers and recorded conv states back to the first `length` positions.

    Always crops, even to remove nothing: recording layers trim what they kept for this
    rollback back to their window. Recurrent states are left as they are (`specdec.runtime.replay.restore`).
    """
    current = cache_length(cache)
    if length > current or length < 0:
        raise ValueError(f"cannot crop a cache of {current} positions to {length}")
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin) and not any(layer.is_conv_states_initialized.values()):
            continue  # never run: nothing recorded, and its crop would fail on the missing states
        cast(Any, layer).crop(length - current)  # transformers 5.x: negative = tokens to remove


def gather_positions(cache: Cache, base: int, rows: list[int]) -> None:
    """Keep the first `base` positions, then the positions base + rows[0], base + rows[1], ...

    After a tree forward appended n + 1 rows at `base`, this moves the accepted path's keys and
    values into place (rows ascending) and drops the rest, in every (full-attention) layer.
    """
    current = cache_length(cache)
    if any(not 0 <= row < current - base for row in rows) or any(a >= b for a, b in zip(rows, rows[1:])):
        raise ValueError(f"cannot gather rows {rows} after position {base} from a cache of {current} positions")
    if rows != list(range(len(rows))):
        source = torch.tensor(rows, dtype=torch.long) + base
        for layer in cache.layers:
            kv = cast(Any, layer)  # full-attention layers (`tree_obstacle` keeps the others out)
            if getattr(kv, "keys", None) is not None and kv.keys.numel():
                index = source.to(kv.keys.device)
                kv.keys[..., base : base + len(rows), :] = kv.keys[..., index, :]
                kv.values[..., base : base + len(rows), :] = kv.values[..., index, :]
    crop_cache(cache, base + len(rows))


def set_static_length(cache: Cache, length: torch.Tensor) -> None:
    """Set a static cache's length to `length` (a 0-d integer tensor on the cache's device) in
    place: a rollback that a compiled step can run inside its graph, between two forwards."""
    for layer in cache.layers:
        if isinstance(layer, StaticLayer) and layer.is_initialized:
            layer.cumulative_length.copy_(length)
        elif isinstance(layer, LinearStates):
            layer.set_length(length)


def gather_columns(cache: Cache, order: torch.Tensor) -> None:
    """Reorder a batched static cache's columns in place, row by row: afterwards row b's column j
    holds what its column order[b, j] held ([B, C] indices on the cache's device)."""
    for layer in cache.layers:
        if isinstance(layer, StaticLayer) and layer.is_initialized:
            for name in ("keys", "values"):
                stored = cast(torch.Tensor, getattr(layer, name))  # (B, heads, C, d)
                index = order[:, None, :, None].expand(-1, stored.shape[1], -1, stored.shape[3])
                stored.copy_(stored.gather(2, index))


def select_batch(cache: Cache, rows: torch.Tensor) -> None:
    """Keep the batch rows `rows` ([b] indices, in that order) of a static cache: each layer's
    buffers are replaced by smaller ones, so a later forward runs a batch of b rows."""
    for layer in cache.layers:
        if isinstance(layer, StaticLayer) and layer.is_initialized:
            layer.keys = cast(torch.Tensor, layer.keys).index_select(0, rows.to(layer.device))
            layer.values = cast(torch.Tensor, layer.values).index_select(0, rows.to(layer.device))
            layer.batch_size = int(rows.shape[0])
            if layer.device.type == "cuda":  # fixed addresses for the CUDA graphs that replay on them
                torch._dynamo.mark_static_address(layer.keys)
                torch._dynamo.mark_static_address(layer.values)


def static_cache_bytes(config: Any, capacity: int, dtype: torch.dtype) -> int:
    """Bytes of the keys and values a static cache of `capacity` positions holds for a model with
    `config`: attention layers (full or sliding) that hold their own x 2 x KV heads x head dim x
    capacity x the dtype's size (a model whose layers differ in head dim, Gemma 4's, is not counted
    right)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
    types = get_layer_types_and_kwargs(text)[0]  # layers sharing another's keys and values are "dummy"
    layers = sum(1 for kind in types if kind in ("full_attention", SLIDING))  # a sliding layer holds every position too
    return layers * 2 * heads * head_dim * capacity * torch.empty((), dtype=dtype).element_size()


def _static_cache(config: Any, capacity: int) -> StaticCache:
    """transformers' static cache for a model with `config`, every sliding layer's window-sized
    ring replaced by a full-length layer: a ring cannot be rolled back, and the window is the
    mask's business (`specdec.runtime.windows`)."""
    cache = StaticCache(config=config, max_cache_len=capacity)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    cache.layers = [StaticLayer(max_cache_len=capacity) if isinstance(layer, StaticSlidingWindowLayer)
                    else LinearStates(**linear_dims(text)) if type(layer) is LinearAttentionLayer else layer
                    for layer in cache.layers]
    return cache


class KV:
    """One model's KV cache and the number of positions it holds.

    The length is kept on the host, so reading it never waits for the device. With a capacity
    the cache is static (preallocated; rollback sets the length); without one it is dynamic.
    `owner` is a model or a drafter head: anything whose `.config` describes its layers.
    """

    def __init__(self, owner: Any, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.attention = attention_kinds(owner)
        self.cache: Cache = new_cache(owner) if capacity is None else _static_cache(owner.config, capacity)
        self.length = 0
        self._layers = [layer for layer in self.cache.layers if isinstance(layer, StaticLayer)]
        self._linear = [layer for layer in self.cache.layers if isinstance(layer, LinearStates)]
        if self._linear:
            serve_linear_layers(owner)  # their forwards that keep rows keep every row's state
        first = next(owner.parameters(), None)
        self._dtype = first.dtype if first is not None else torch.float32
        self._device = first.device if first is not None else torch.device("cpu")
        # the position each column holds, per batch row [B, C], which a sliding layer's mask reads;
        # kept by static caches of models with sliding layers (elsewhere column c holds position c)
        self.positions: torch.Tensor | None = None
        if capacity is not None and self.attention.sliding:
            self.positions = torch.arange(capacity, device=self._device)[None]

    @property
    def static(self) -> bool:
        return self.capacity is not None

    @property
    def recurrent(self) -> bool:
        """Whether the cache keeps linear-attention layers per position (`LinearStates`)."""
        return bool(self._linear)

    @property
    def kernel(self) -> int:
        """The conv kernel of the linear-attention layers (they share one)."""
        return self._linear[0].kernel

    def fits(self, capacity: int | None, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether this static cache can be reused for `capacity` positions of `dtype` on `device`."""
        if capacity is None or self.capacity != capacity:
            return False
        stored = [cast(torch.Tensor, layer.keys) for layer in self._layers if layer.is_initialized]
        return all(keys.dtype == dtype and keys.device == device for keys in stored)

    @property
    def initialized(self) -> bool:
        """Whether a static cache's buffers exist (transformers allocates them on the first write)."""
        return all(layer.is_initialized for layer in self._layers)

    @property
    def nbytes(self) -> int:
        """Bytes held by the keys and values."""
        total = 0
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                tensor = getattr(layer, name, None)
                if isinstance(tensor, torch.Tensor):
                    total += tensor.numel() * tensor.element_size()
        return total

    def reserve(self, rows: int, layout: str | TreeLayout | None = None, batch: int = 1) -> None:
        """Check that a forward of `rows` rows fits after the held positions, and ready the
        linear-attention layers for it (`batch` rows of a batch): `layout` None feeds rows that are
        committed at once (a prefill: whatever rows were kept since the last commit are committed
        first), CHAIN or a TreeLayout keeps every row's state until the commit (`rollback`,
        `gather`, a batch's `commit_rows`)."""
        if self.capacity is not None and self.length + rows > self.capacity:
            raise ValueError(f"a forward of {rows} rows after {self.length} cached positions overflows the static "
                             f"cache of {self.capacity} positions; size it for the whole generation")
        if self._linear:
            kept = self.length - self._linear[0].anchor
            if layout is None and kept:
                self.rollback(self.length)
                kept = 0
            for layer in self._linear:
                layer.ensure(batch, self._dtype, self._device, kept + rows if layout is not None else 0)
                layer.layout = layout

    def advanced(self, rows: int, positions: torch.Tensor | None = None) -> None:
        """Record that a forward appended `rows` columns, holding `positions` [B, rows] (None:
        the columns' own indices, as a causal forward writes them)."""
        if self.positions is not None:
            span = slice(self.length, self.length + rows)
            if positions is None:
                self.positions[:, span] = torch.arange(span.start, span.stop, device=self.positions.device)
            else:
                self._batch(positions.shape[0])[:, span] = positions.to(self.positions.device)
        self.length += rows
        for layer in self._linear:
            if layer.layout is None:  # a forward that kept no rows: its end is committed
                layer.committed(self.length)
            layer.layout = None

    def _batch(self, rows: int) -> torch.Tensor:
        """The column positions, widened to `rows` batch rows on a batch's first write."""
        assert self.positions is not None
        if self.positions.shape[0] != rows:
            self.positions = self.positions.expand(rows, -1).clone()
        return self.positions

    def key_positions(self, positions: torch.Tensor) -> torch.Tensor | None:
        """The positions [B, C] the columns will hold once a forward writes rows at `positions`
        [B, R] after the held ones: what a sliding layer's mask compares the rows' positions with
        (None for a cache that keeps none, `positions`)."""
        if self.positions is None:
            return None
        keys = self._batch(positions.shape[0]).clone()
        keys[:, self.length : self.length + positions.shape[1]] = positions.to(keys.device)
        return keys

    def reorder(self, order: torch.Tensor) -> None:
        """Reorder a batch's columns row by row: row b's column j takes what its column order[b, j]
        held ([B, C] indices), keys, values and positions alike."""
        gather_columns(self.cache, order)
        if self.positions is not None:
            self.positions = self._batch(order.shape[0]).gather(1, order.to(self.positions.device))

    def select(self, rows: torch.Tensor) -> None:
        """Keep the batch rows `rows` ([b] indices, in that order)."""
        select_batch(self.cache, rows)
        for layer in self._linear:
            layer.select(rows)
        if self.positions is not None and self.positions.shape[0] > 1:
            self.positions = self.positions.index_select(0, rows.to(self.positions.device))

    def commit_rows(self, kept: list[list[int]]) -> None:
        """A batch's commit after a forward that kept its rows' states (every row of it fed since
        the last commit): batch row b keeps the new rows kept[b] (ascending, a path from the
        first; empty: it keeps nothing and its state stays). Each linear-attention layer takes,
        per batch row, the state after its last kept row and the conv window along its path; the
        attention layers' columns are the caller's business (a batch's holes)."""
        if not self._linear:
            return
        layer = self._linear[0]
        kernel, fed = layer.kernel, self.length - layer.anchor
        if any(len(rows) and (rows[-1] >= fed or rows != sorted(set(rows))) for rows in kept):
            raise ValueError(f"cannot commit rows {kept} of a forward of {fed} rows")
        states = [1 + rows[-1] if rows else 0 for rows in kept]  # in cat(committed state, slot states)
        windows = [(list(range(kernel)) + [kernel + row for row in rows])[-kernel:] for rows in kept]
        states_t = torch.tensor(states, dtype=torch.long).to(self._device, non_blocking=True)  # (B,)
        windows_t = torch.tensor(windows, dtype=torch.long).to(self._device, non_blocking=True)  # (B, K)
        for linear in self._linear:
            linear.commit_rows(states_t, windows_t, self.length)

    def rebase(self, length: int) -> None:
        """A batch's compaction: its columns moved to the front, `length` of them now hold what
        every row keeps. The attention layers' length becomes `length`; the linear-attention
        layers' committed states stay as they are, anchored at `length`."""
        if self._linear and self.length != self._linear[0].anchor:
            raise ValueError("a batch compacts its columns only between steps, with every row's state committed")
        for linear in self._linear:
            linear.rebase(length)
        self.retreat(length)

    def mask_width(self, rows: int) -> int:
        """Columns of the 4D mask of a forward of `rows` rows: the capacity, or the cached positions plus rows."""
        return self.capacity if self.capacity is not None else self.length + rows

    def rollback(self, length: int) -> None:
        """Keep the first `length` positions and commit them: a linear-attention layer takes the
        state after position length - 1, which it kept if fed since its last commit (a rollback
        further back is refused; to 0 it starts afresh). On a dynamic cache a recurrent state is
        the caller's business (`specdec.runtime.replay`)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back a cache of {self.length} positions to {length}")
        for layer in self._linear:
            if length == 0:
                layer.restart()
            elif length < layer.anchor:
                raise ValueError(f"cannot roll back a cache of {self.length} positions to {length}: its "
                                 f"linear-attention layers committed {layer.anchor} positions, and keep the state of "
                                 "every position fed since then only")
            else:
                layer.commit_chain(length)
        self.retreat(length)

    def retreat(self, length: int) -> None:
        """Drop the positions past `length` without committing any: the rows kept since the last
        commit up to `length` stay kept (a padded step's padding goes this way)."""
        if not 0 <= length <= self.length or self._linear and length < self._linear[0].anchor:
            raise ValueError(f"cannot roll back a cache of {self.length} positions to {length}")
        if self.capacity is None:
            crop_cache(self.cache, length)
        else:
            for layer in self._layers:
                layer.cumulative_length.fill_(length)
            for linear in self._linear:
                if linear.offset is not None:
                    linear.offset.fill_(length - linear.anchor)
        self.length = length

    def gather(self, base: int, rows: list[int]) -> None:
        """Keep positions [0, base), then base + rows[0], base + rows[1], ... (rows ascending), in place."""
        if any(not 0 <= row < self.length - base for row in rows) or any(a >= b for a, b in zip(rows, rows[1:])):
            raise ValueError(f"cannot gather rows {rows} after position {base} from a cache of {self.length} positions")
        if self.capacity is None:
            gather_positions(self.cache, base, rows)
        elif rows != list(range(len(rows))):
            index: torch.Tensor | None = None  # made once: the layers share a device (a per-layer copy cost 32 copies)
            for layer in self._layers:
                if layer.keys is None:  # a layer this process does not run (another pipeline stage's)
                    continue
                keys, values = cast(torch.Tensor, layer.keys), cast(torch.Tensor, layer.values)
                if index is None or index.device != keys.device:
                    index = torch.tensor([base + row for row in rows], dtype=torch.long).to(keys.device,
                                                                                            non_blocking=True)
                keys[:, :, base : base + len(rows)] = keys.index_select(2, index)
                values[:, :, base : base + len(rows)] = values.index_select(2, index)
            if self.positions is not None:
                moved = torch.tensor([base + row for row in rows], dtype=torch.long) if index is None else index
                moved = moved.to(self.positions.device)
                self.positions[:, base : base + len(rows)] = self.positions.index_select(1, moved)
        if self._linear:
            if base < self._linear[0].anchor:
                raise ValueError(f"cannot gather rows after position {base}: the linear-attention layers committed "
                                 f"{self._linear[0].anchor} positions")
            window = self._linear[0].path_window(base, rows)
            for layer in self._linear:
                layer.commit_path(base, rows, window)
            self.retreat(base + len(rows))
            return
        self.rollback(base + len(rows))
