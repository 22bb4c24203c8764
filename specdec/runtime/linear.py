"""Linear-attention layers (GatedDeltaNet: Qwen3-Next, Qwen3.5) on the static cache, without
replay: a verify forward keeps the conv input and the recurrent state after every row it feeds,
and the commit takes the accepted row's.

Each such layer's cache is a `LinearStates`: the committed conv window (the last K inputs of the
causal convolution, K its kernel) and recurrent state, as transformers keeps them, plus slots
for the rows fed since the last commit (their conv inputs [B, C, S] and states [B, S, H, Dk, Dv]).
A forward that keeps rows (a verify, a drafter's step; `layout` set) runs `keep_forward`, which
computes every row from its parent row's state (`specdec.runtime.delta_rule`): chains and token
trees alike, so a rejected branch costs nothing to undo. The commit (`commit_chain`,
`commit_path`; in a batch `commit_rows`, each batch row its own path) copies the accepted row's
state and conv window into place: no snapshot, no second forward. A forward that keeps nothing (a prefill) is transformers' own, on the committed
state. Vendors' engines keep one state per draft position the same way; SGLang also per tree node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import LinearAttentionLayer

from specdec.runtime.delta_rule import gated_delta_chain, gated_delta_tree, tree_conv

__all__ = ["CHAIN", "LinearStates", "TreeLayout", "linear_dims", "serve_linear_layers", "served_layers", "tree_layout",
           "visible_layout"]

CHAIN = "chain"  # a layout: each row's parent is the row before it (the first row's, the state before the forward)
_SERVED = ("Qwen3NextGatedDeltaNet", "Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet")


@dataclass(frozen=True)
class TreeLayout:
    """The rows of a tree forward: parents [B, n] (each row's parent row, -1 the state before
    the forward), ancestors [B, n, K - 1] (a row's K - 1 previous inputs, oldest first: rows of
    the forward >= 0, positions before it < 0, -1 the last), `depth` the passes the state
    recursion runs (at least the deepest row's depth)."""

    parents: torch.Tensor
    ancestors: torch.Tensor
    depth: int


def tree_layout(parents: list[int], kernel: int, device: torch.device) -> TreeLayout:
    """The TreeLayout of rows whose parents (-1: before the forward) are `parents`, for a conv of
    `kernel` inputs; the depth is rounded up to a power of two, so trees of nearby depths share
    one compiled graph."""
    ancestors, depths = [], []
    for row, parent in enumerate(parents):
        chain, node, outside = [], parent, -1
        while len(chain) < kernel - 1:
            if node >= 0:
                chain.append(node)
                node = parents[node]
            else:
                chain.append(outside)
                outside -= 1
        ancestors.append(chain[::-1])
        depths.append(1 + (depths[parent] if parent >= 0 else 0))
    depth = 1 << (max(depths) - 1).bit_length()
    return TreeLayout(torch.tensor([parents], dtype=torch.long).to(device),
                      torch.tensor([ancestors], dtype=torch.long).reshape(1, len(parents), kernel - 1).to(device),
                      depth)


def visible_layout(visible: torch.Tensor, kernel: int, depth: int) -> TreeLayout:
    """The TreeLayout of a batch's rows from what each row sees among them, visible [B, n, n]
    (True = attend; a row sees its ancestors and itself): each row's parent is the latest earlier
    row it sees (-1: none, the state before the forward). Computed on the device, no host sync;
    `depth` (at least the deepest row's depth, kept as given: the caller holds it fixed across a
    decode, so its steps share one graph) comes from the caller, who laid the rows out."""
    rows = visible.shape[-1]
    steps = torch.arange(rows, device=visible.device)
    earlier = visible & (steps[None, :] < steps[:, None])[None]  # (B, n, n) strictly earlier rows seen
    parents = torch.where(earlier, steps, -1).amax(dim=-1)  # (B, n)
    chain, previous = [], parents
    for _ in range(kernel - 1):  # the K - 1 previous inputs, newest first: rows, then -1, -2, ... before
        chain.append(previous)
        previous = torch.where(previous >= 0, parents.gather(1, previous.clamp(min=0)), previous - 1)
    ancestors = torch.stack(chain[::-1], dim=-1)  # (B, n, K - 1) oldest first
    return TreeLayout(parents, ancestors, max(depth, 1))


def linear_dims(config: Any) -> dict[str, int]:
    """A GatedDeltaNet layer's sizes from its model's config: conv channels, kernel, value heads,
    key and value head dims."""
    heads_k, heads_v = int(config.linear_num_key_heads), int(config.linear_num_value_heads)
    dk, dv = int(config.linear_key_head_dim), int(config.linear_value_head_dim)
    return {"channels": 2 * heads_k * dk + heads_v * dv, "kernel": int(config.linear_conv_kernel_dim),
            "heads": heads_v, "dk": dk, "dv": dv}


class LinearStates(LinearAttentionLayer):
    """One linear-attention layer's state on the static cache (see the module docstring).

    `anchor` is the position count of the committed state (host int; `anchor_t` the same on the
    device), `offset` [] the slots written since (device, advanced inside compiled steps). All
    buffers keep their addresses once allocated (`ensure`), so compiled graphs replay on them.
    """

    def __init__(self, channels: int, kernel: int, heads: int, dk: int, dv: int) -> None:
        super().__init__()
        self.channels, self.kernel, self.heads, self.dk, self.dv = channels, kernel, heads, dk, dv
        self.conv_kernel_size[0] = kernel
        self.anchor = 0
        self.slots = 0
        self.layout: str | TreeLayout | None = None  # None: the next forward keeps no rows
        self.inputs: torch.Tensor | None = None  # (B, C, S) the conv inputs of the slots
        self.states: torch.Tensor | None = None  # (B, S, H, Dk, Dv) the state after each slot
        self.offset: torch.Tensor | None = None  # () slots written since the anchor
        self.anchor_t: torch.Tensor | None = None  # () the anchor, on the device

    def ensure(self, batch: int, dtype: torch.dtype, device: torch.device, slots: int) -> None:
        """Allocate the committed state and at least `slots` slots (kept rows since a commit),
        keeping what the slots in use hold."""
        if self.offset is None:
            state = torch.promote_types(dtype, torch.float32)
            self.conv_states[0] = torch.zeros(batch, self.channels, self.kernel, dtype=dtype, device=device)
            self.recurrent_states[0] = torch.zeros(batch, self.heads, self.dk, self.dv, dtype=state, device=device)
            self.is_conv_states_initialized[0] = self.is_recurrent_states_initialized[0] = True
            self.dtype, self.device = dtype, device
            self.offset = torch.zeros((), dtype=torch.long, device=device)
            self.anchor_t = torch.zeros((), dtype=torch.long, device=device)
        if slots > self.slots:
            window, state = self.conv_states[0], self.recurrent_states[0]
            assert window is not None and state is not None
            size = -(-slots // 8) * 8
            inputs = window.new_zeros(window.shape[0], self.channels, size)
            states = state.new_zeros(state.shape[0], size, self.heads, self.dk, self.dv)
            if self.inputs is not None and self.states is not None:
                inputs[..., : self.slots] = self.inputs
                states[:, : self.slots] = self.states
            self.inputs, self.states, self.slots = inputs, states, size
        if device.type == "cuda" and not torch.compiler.is_compiling():  # fixed addresses for CUDA graphs
            for tensor in (self.window, self.state, self.inputs, self.states, self.offset, self.anchor_t):
                torch._dynamo.mark_static_address(tensor)

    @property
    def window(self) -> torch.Tensor:
        window = self.conv_states[0]
        assert window is not None
        return window

    @property
    def state(self) -> torch.Tensor:
        state = self.recurrent_states[0]
        assert state is not None
        return state

    def restart(self) -> None:
        """Forget everything: the next forward starts from position 0."""
        if self.offset is not None:
            self.window.zero_()
            self.state.zero_()
            self.offset.zero_()
            self.anchor_t.zero_()  # type: ignore[union-attr]
        self.has_previous_state[0] = False
        self.anchor = 0

    def committed(self, length: int) -> None:
        """Record that a forward keeping no rows left the committed state at `length` positions."""
        self.anchor = length
        if self.anchor_t is not None:
            self.anchor_t.fill_(length)

    def commit_chain(self, length: int) -> None:
        """Take the state after position length - 1, fed since the anchor as a chain of rows."""
        if length == self.anchor:
            self._reanchor(length)
            return
        first = length - self.anchor  # slots [0, first) lead to the new state
        pool = torch.cat([self.window, self._inputs()], dim=-1)  # (B, C, K + S): position p at K + p - anchor
        self.window.copy_(pool[..., first : first + self.kernel])
        self.state.copy_(self._states()[:, first - 1])
        self._reanchor(length)

    def path_window(self, base: int, rows: list[int]) -> torch.Tensor:
        """Where the conv window after the path `rows` (ascending, the root first) of the tree fed at
        `base` lies in cat(window, slot inputs): [K] indices on the layer's device, the same for
        every layer of a model (they share the kernel and the anchor), so made once per commit."""
        if not rows:
            raise ValueError("a tree's kept path holds at least its root (row 0)")
        start = base - self.anchor  # the tree's first slot
        index = [self.kernel + start - j for j in range(self.kernel, 0, -1)] + [self.kernel + start + r for r in rows]
        return torch.tensor(index[-self.kernel :], dtype=torch.long).to(self.window.device, non_blocking=True)

    def commit_path(self, base: int, rows: list[int], window: torch.Tensor) -> None:
        """Take the state after the path `rows` (ascending) of the tree fed at position `base`,
        its conv window at `window` (`path_window`)."""
        pool = torch.cat([self.window, self._inputs()], dim=-1)
        self.window.copy_(pool.index_select(-1, window))
        self.state.copy_(self._states()[:, base - self.anchor + rows[-1]])
        self._reanchor(base + len(rows))

    def commit_rows(self, states: torch.Tensor, windows: torch.Tensor, length: int) -> None:
        """A batch's commit, each batch row its own: row b takes the state at states[b] in
        cat(state, slot states) (0: the committed one) and its conv window at windows[b] [K] in
        cat(window, slot inputs); `length` becomes the anchor (the batch's column count)."""
        pool = torch.cat([self.window, self._inputs()], dim=-1)  # (B, C, K + S)
        index = windows[:, None, :].expand(-1, self.channels, -1)  # (B, C, K)
        self.window.copy_(pool.gather(2, index))
        rows = torch.arange(states.shape[0], device=states.device)
        kept = self._states()[rows, (states - 1).clamp(min=0)]  # (B, Hv, Dk, Dv): B states read, not B x S
        self.state.copy_(torch.where((states > 0)[:, None, None, None], kept, self.state))
        self._reanchor(length)

    def select(self, rows: torch.Tensor) -> None:
        """Keep the batch rows `rows` ([b] indices, in that order) of every buffer."""
        if self.offset is None:
            return
        index = rows.to(self.window.device)
        self.conv_states[0] = self.window.index_select(0, index)
        self.recurrent_states[0] = self.state.index_select(0, index)
        if self.inputs is not None and self.states is not None:  # slots exist once a step kept rows
            self.inputs, self.states = self.inputs.index_select(0, index), self.states.index_select(0, index)
        if self.window.device.type == "cuda":
            for tensor in (self.window, self.state, self.inputs, self.states):
                if tensor is not None:
                    torch._dynamo.mark_static_address(tensor)

    def rebase(self, length: int) -> None:
        """The columns moved (a batch's compaction), the states did not: the anchor becomes `length`."""
        self._reanchor(length)

    def set_length(self, length: torch.Tensor) -> None:
        """Inside a compiled step: the slots written since the anchor become `length - anchor`."""
        if self.offset is not None and self.anchor_t is not None:
            self.offset.copy_(length - self.anchor_t)

    def _reanchor(self, length: int) -> None:
        self.anchor = length
        if self.offset is not None and self.anchor_t is not None:
            self.offset.zero_()
            self.anchor_t.fill_(length)

    def _inputs(self) -> torch.Tensor:
        assert self.inputs is not None
        return self.inputs

    def _states(self) -> torch.Tensor:
        assert self.states is not None
        return self.states


def served_layers(model: nn.Module) -> int:
    """How many of `model`'s layers are GatedDeltaNet layers `keep_forward` serves."""
    return sum(type(module).__name__ in _SERVED for module in model.modules())


def serve_linear_layers(model: nn.Module) -> None:
    """Route the GatedDeltaNet layers of `model` through `keep_forward` whenever their cache layer
    is a `LinearStates` with a layout; every other call runs transformers' forward unchanged.
    Idempotent."""
    for module in model.modules():
        if type(module).__name__ in _SERVED and not getattr(module, "_specdec_served", False):
            module.forward = _routed(module, module.forward)
            module._specdec_served = True


def _routed(module: nn.Module, original: Any) -> Any:
    def forward(hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None, **kwargs: Any) -> Any:
        layer = cache.layers[module.layer_idx] if cache is not None and hasattr(cache, "layers") else None
        if isinstance(layer, LinearStates) and layer.layout is not None:
            return keep_forward(module, hidden_states, layer)
        return original(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)

    return forward


def keep_forward(module: nn.Module, hidden_states: torch.Tensor, layer: LinearStates) -> torch.Tensor:
    """A GatedDeltaNet layer's forward over rows [B, n, H] that keeps each row's conv input and
    state in the layer's next slots, each row computed from its parent's (`layer.layout`)."""
    batch, rows = hidden_states.shape[:2]
    mixed, z, b, a = _project(module, hidden_states)  # (B, C, n), (B, n, Hv, Dv), (B, n, Hv) twice
    kernel = layer.kernel
    offset = layer.offset
    assert offset is not None
    device = hidden_states.device
    if layer.layout == CHAIN:
        steps = torch.arange(rows, device=device)
        parents, depth = None, rows
        ancestors = (steps[:, None] - (kernel - 1) + torch.arange(kernel - 1, device=device)[None])[None]
        ancestors = ancestors.expand(batch, -1, -1)
    else:
        assert isinstance(layer.layout, TreeLayout)
        parents, ancestors, depth = layer.layout.parents, layer.layout.ancestors, layer.layout.depth
    pool = torch.cat([layer.window, layer._inputs()], dim=-1)  # (B, C, K + S)
    reach = torch.where(ancestors >= 0, ancestors + pool.shape[-1], ancestors + kernel + offset)
    conv = ACT2FN[module.activation](tree_conv(pool, reach, mixed, module.conv1d.weight.squeeze(1),
                                               module.conv1d.bias))  # (B, C, n)
    slots = offset + torch.arange(rows, device=device)  # (n,)
    layer._inputs().index_copy_(2, slots, mixed.to(layer._inputs().dtype))
    query, key, value = torch.split(conv.transpose(1, 2), [module.key_dim, module.key_dim, module.value_dim], dim=-1)
    query = query.reshape(batch, rows, -1, module.head_k_dim)
    key = key.reshape(batch, rows, -1, module.head_k_dim)
    value = value.reshape(batch, rows, -1, module.head_v_dim)
    beta = b.sigmoid()
    g = -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)  # (B, n, Hv)
    # the state before the rows: the committed one, or the last slot's (one state read, not all the slots')
    last = layer._states().index_select(1, (offset - 1).clamp(min=0).view(1))[:, 0]  # (B, Hv, Dk, Dv)
    tip = torch.where(offset > 0, last, layer.state)
    out, states = gated_delta_chain(query, key, value, g, beta, tip) if layer.layout == CHAIN else \
        gated_delta_tree(query, key, value, g, beta, tip, parents, depth)
    layer._states().index_copy_(1, slots, states.to(layer._states().dtype))
    offset.add_(rows)
    layer.has_previous_state[0] = True
    out = out.to(hidden_states.dtype).reshape(-1, module.head_v_dim)
    out = module.norm(out, z.reshape(-1, module.head_v_dim)).reshape(batch, rows, -1)
    return module.out_proj(out)


def _project(module: nn.Module, hidden_states: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's input projections: conv inputs [B, C, n] (query, key, value channels), the
    gate z [B, n, Hv, Dv], and b, a [B, n, Hv], in Qwen3-Next's fused layout or Qwen3.5's split one."""
    batch, rows = hidden_states.shape[:2]
    if hasattr(module, "in_proj_qkvz"):
        query, key, value, z, b, a = module.fix_query_key_value_ordering(module.in_proj_qkvz(hidden_states),
                                                                         module.in_proj_ba(hidden_states))
        query, key, value = (x.reshape(batch, rows, -1) for x in (query, key, value))
        mixed = torch.cat([query, key, value], dim=-1).transpose(1, 2)
        return mixed, z, b, a
    mixed = module.in_proj_qkv(hidden_states).transpose(1, 2)
    z = module.in_proj_z(hidden_states).reshape(batch, rows, -1, module.head_v_dim)
    return mixed, z, module.in_proj_b(hidden_states), module.in_proj_a(hidden_states)
