"""Adapter over a transformers causal LM: one KV cache (static where the model allows), forwards
that keep only the logits asked for, the hidden states drafters read, token-tree and masked
forwards, exact rollback to a prefix, and fixed-shape steps that run compiled.

The same adapter serves the target and any drafter that runs a causal LM of its own. The forward
itself is `specdec.runtime.forward.model_forward`; the cache's bookkeeping is `specdec.runtime.cache.KV`
(GatedDeltaNet states per row: `specdec.runtime.linear`), and a dynamic-cache hybrid's rollback
(recurrent state restored, then replayed) `specdec.runtime.replay`.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

from specdec.distributed.ranks import Ranks, model_ranks
from specdec.runtime.cache import KV, check_transformers, has_recurrent_state, new_cache
from specdec.runtime.engine import Step, fed_step, step_for
from specdec.runtime.linear import CHAIN, TreeLayout, tree_layout
from specdec.runtime.forward import (LAST_LAYER, final_norm, float_parameter, head_shape, is_pipelined, model_forward,
                                     prepare_for_compile)
from specdec.runtime.obstacles import static_obstacle, tree_obstacle, uncroppable_layers
from specdec.runtime.quantize import Int8Linear
from specdec.runtime.replay import Replay
from specdec.runtime.tree_logits import TreeLogits, head_reproduces
from specdec.runtime.whole_prompt import whole_prompt
from specdec.runtime.windows import attention_kinds, layer_masks
from specdec.trees import verify_layout
from specdec.types import ExtraRows

__all__ = ["CausalLM", "TreeLogits"]

class CausalLM:
    """One causal LM and its KV cache, batch size 1.

    Invariant kept by the decode loop: the cache holds every committed token but the last.

    `reset(capacity, compile)` chooses the cache: static with `capacity` positions where the
    model allows (`static_obstacle` is None), dynamic otherwise. A forward given `rows` is a
    fixed-shape step: on a static cache its input is padded to `rows` positions (the padding is
    rolled back, unseen by the real rows) and, with `compile`, it runs compiled. Forwards
    without `rows` (prefills, whose length varies) run eagerly.
    """

    def __init__(self, model: PreTrainedModel, share_cache: bool = False, role: str = "") -> None:
        """share_cache: take a static cache of the right size left by an earlier adapter of the same
        model that shared its own (`specdec.generate` does, so repeated calls reuse one buffer and
        the CUDA graphs captured on it); such adapters must not run at the same time.
        role: names this adapter's compiled steps apart from other adapters of the same model
        (a draft model that is the target itself keeps graphs, and CUDA graphs, of its own)."""
        if not isinstance(model, PreTrainedModel) or model.get_output_embeddings() is None:
            raise TypeError(
                f"expected a transformers causal LM (e.g. from AutoModelForCausalLM), got "
                f"{type(model).__name__}"
            )
        check_transformers()
        if model.training:
            raise ValueError(f"{type(model).__name__} is in training mode (dropout would make decoding "
                             "random); call model.eval() first")
        unsupported = uncroppable_layers(model)
        if unsupported:
            raise ValueError(
                f"{type(model).__name__} has {', '.join(unsupported)} layers whose state cannot be "
                "rolled back to a prefix; specdec serves attention and linear-attention layers"
            )
        self.model = model
        self.config = model.config.get_text_config()
        head = head_shape(model)  # (V, H); None on a pipeline stage that holds no LM head
        anchor = float_parameter(model)
        self.vocab_size: int = head[0] if head is not None else int(self.config.vocab_size)
        self.device: torch.device = anchor.device
        self.dtype: torch.dtype = anchor.dtype
        positions = getattr(self.config, "max_position_embeddings", None) or getattr(
            self.config, "n_positions", None
        )
        self.max_positions: int | None = int(positions) if positions else None
        # Rotary models run past max_position_embeddings (degrading); learned tables cannot.
        self.learned_positions: bool = not any(
            getattr(self.config, name, None) for name in ("rope_parameters", "rope_theta", "rope_scaling")
        )
        self.hidden_size: int = head[1] if head is not None else int(self.config.hidden_size)
        self.num_layers: int = int(self.config.num_hidden_layers)  # hidden-state indices run 0..num_layers
        self.static_obstacle: str | None = static_obstacle(model)  # why the cache cannot be static (None: it can)
        # whether eager decoding keeps the static cache too (`Engine.cache_capacity`): linear-attention
        # layers roll back there without replaying, and sliding layers keep every position there, which
        # trees, batches and the self drafter's masked forwards need
        self.static_eagerly: bool = has_recurrent_state(new_cache(model)) or attention_kinds(model).sliding
        self.ranks: Ranks | None = model_ranks(model)  # the processes holding a sharded model (`specdec.distributed.ranks`)
        # pipeline placement (a pipeline-parallel stage, or a device_map over several devices): each
        # forward gets an explicit 4D mask and position ids, without which transformers' cached
        # forwards of several query tokens are wrong there
        self.pipelined: bool = is_pipelined(model)
        self.kv: KV | None = None
        self._share = share_cache
        self._role = f" ({role})" if role else ""
        self._step: Step | None = None  # the model's forward as a (compiled) fixed-shape step
        self._compile = False  # whether the last reset asked for compiled steps
        self._chains: dict[tuple[Any, ...], Step] = {}  # drafters' loops of forwards (`chain`)
        self._obstacle: str | None = None  # why tree forwards are impossible (None: they are not)
        # whether logits = lm_head(hidden states); None: not yet known. Never for a quantized head: run
        # eagerly it multiplies with another kernel than the compiled graph, whose bfloat16 outputs round
        # otherwise, so every logits row (and the first verify, which would check it eagerly) comes from
        # the graph, as a one-row step's does (`specdec.runtime.quantize`)
        self._lazy_head: bool | None = False if isinstance(model.get_output_embeddings(), Int8Linear) else None
        self._replay: Replay | None = None  # a hybrid model's snapshots, for its rollback

    @property
    def embed_tokens(self) -> nn.Module:
        """The input embedding (token ids -> [.., H])."""
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        """The output projection ([.., H] -> logits [.., V])."""
        return self.model.get_output_embeddings()

    @property
    def final_norm(self) -> nn.Module | None:
        """The norm applied before the LM head, when the architecture has a known one."""
        return final_norm(self.model)

    @property
    def cache(self) -> Cache:
        """transformers' cache object (created on first use)."""
        return self._kv.cache

    @property
    def cache_length(self) -> int:
        """Positions held by the KV cache."""
        return self.kv.length if self.kv is not None else 0

    @property
    def static(self) -> bool:
        """Whether the cache is static (preallocated, rolled back by setting its length)."""
        return self.kv is not None and self.kv.static

    @property
    def compiled(self) -> bool:
        """Whether fixed-shape forwards run compiled."""
        return self._step is not None and self._step.compiled

    @property
    def _kv(self) -> KV:
        if self.kv is None:
            self.reset()
        assert self.kv is not None
        return self.kv

    def reset(self, capacity: int | None = None, compile: bool = False) -> None:
        """Empty the cache; the next forward starts at position 0.

        capacity: positions of a static cache (None: a dynamic cache that grows). A static
        cache of the same size is reused, its stale entries masked. Models that cannot run on a
        static cache (`static_obstacle`) get a dynamic one, and eager forwards.
        """
        wanted = capacity if self.static_obstacle is None else None
        shared = _SHARED.get(self.model) if self._share else None
        if shared is not None and (self.kv is None or not self.kv.fits(wanted, self.dtype, self.device)):
            self.kv = shared
        if self.kv is not None and self.kv.fits(wanted, self.dtype, self.device):
            self.kv.rollback(0)
        else:
            self.kv = KV(self.model, wanted)
            if self._share and self.kv.static:
                _SHARED[self.model] = self.kv
        compile = compile and self.kv.static
        if self._step is None or self._compile != compile:
            if compile:
                prepare_for_compile(self.model)
            self._step = Step(model_forward, f"the {type(self.model).__name__} forward{self._role}", compile,
                              self.model, restore=self._restore)
            self._chains = {}
            self._compile = compile
        self._replay = Replay() if has_recurrent_state(self.kv.cache) and not self.kv.static else None
        self._obstacle = tree_obstacle(self.model, self.kv.cache)
        if self.pipelined and self._obstacle is not None:
            raise ValueError(f"{type(self.model).__name__} is placed across pipeline stages, where every forward "
                             f"needs an explicit 4D mask, but it cannot take one: {self._obstacle}")

    def forward(
        self, input_ids: torch.Tensor, keep: int, hidden: tuple[int, ...] = (), rows: int | None = None,
        prompt: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run input_ids [n] after the cached prefix and append them to the cache.

        Returns logits [keep, V] of the last `keep` positions and, if `hidden` names layers, their
        hidden states concatenated, [n, len(hidden) * H] (`hidden_states`: index 0 is the
        embeddings, i the residual stream entering layer i, num_layers or LAST_LAYER the post-norm
        last layer)
        `rows` (>= n) makes it a fixed-shape step of `rows` positions (see the class docstring).
        `prompt` marks a prompt's forward (a prefill, compared with no other), which a quantized
        model runs on its prompt kernels (`specdec.runtime.whole_prompt`).
        """
        n = input_ids.shape[0]
        if not 1 <= keep <= n:
            raise ValueError(f"keep must lie in [1, {n}] (rows of logits to return), got {keep}")
        kv = self._kv
        if self._replay is not None:
            self._replay.record(kv.cache, input_ids)
        if rows is None or not kv.static:
            return self._run(input_ids, keep, hidden, step=rows is not None, layout=None if rows is None else CHAIN,
                             prompt=prompt)
        if rows < n:
            raise ValueError(f"rows ({rows}) must be at least the {n} ids fed")
        base = kv.length
        padded = _pad_ids(input_ids, rows)  # (rows,)
        index = torch.arange(n - keep, n, device=self.device)  # the same graph whatever n
        logits, states = self._run(padded, index, hidden, step=True, layout=CHAIN)
        kv.retreat(base + n)  # the padding is stale
        return logits, None if states is None else states[:n]

    @property
    def tree_obstacle(self) -> str | None:
        """Why this model cannot verify a token tree in one forward (None when it can)."""
        self._kv  # creates the cache (and reads the obstacle) on first use
        return self._obstacle

    def mask_width(self, rows: int) -> int:
        """Columns of a `forward_masked` mask for `rows` rows: the static capacity, or cached + rows."""
        return self._kv.mask_width(rows)

    def forward_tree(self, input_ids: torch.Tensor, parents: list[int], rows: int | None = None,
                     hidden: tuple[int, ...] = (), extra: ExtraRows | None = None) -> TreeLogits:
        """Run a token tree after the cached prefix: input_ids [n + 1] = the root (the last
        committed token) then the n nodes, `parents` their parent indices (-1 = the root).

        Each row sees the prefix, its ancestors and itself, at position cached + depth. `rows`
        pads the forward to a fixed node budget (pad nodes hang off the root, unseen by the
        others). `extra` rows (a drafter's own, `ExtraRows`) follow the tree's rows: each sees
        the prefix, the root, itself and the extra rows its `visible` names, at position cached
        + its offset (clamped to a learned position table), and no tree row sees them. All rows
        are appended to the cache; `keep_path` then keeps the accepted ones.
        The result gives each row's logits on demand, the last layer's hidden states [n + 1, H],
        those of the layers `hidden` names (`TreeLogits.states`, as `forward` returns them) and
        the extra rows' logits (`TreeLogits.extra`, [m, V]).
        """
        n = len(parents)
        width = max(rows or 0, n + 1)
        input_ids = _pad_ids(input_ids, width)  # (width,)
        m = 0 if extra is None else extra.tokens.shape[0]
        if m and self.masked_obstacle is not None:
            raise ValueError(f"{type(self.model).__name__} cannot run extra rows: {self.masked_obstacle}")
        layout = self._tree_layout(parents, width)
        base = self.cache_length
        rows_visible, offsets = verify_layout(parents, width, extra, self.device)  # (width + m, width + m), (width + m,)
        visible = torch.zeros(width + m, self.mask_width(width + m), dtype=torch.bool, device=self.device)
        visible[:, :base] = True
        visible[:, base : base + width + m] = rows_visible
        positions = offsets + base  # (width + m,)
        if extra is not None:
            input_ids = torch.cat([input_ids, extra.tokens])  # (width + m,)
        if self.learned_positions and self.max_positions:
            positions = positions.clamp(max=self.max_positions - 1)
        if self.hidden_obstacle is not None:  # no hidden states (a pipeline stage): every row's logits
            logits, _ = self.forward_masked(input_ids, positions, visible, keep=width + m,
                                            step=self._lazy_head is not None, layout=layout)
            self._lazy_head = False
            return TreeLogits(logits.new_empty(n + 1, 0), self.lm_head, logits[: n + 1], extra=logits[-m:] if m else None)
        # the root's and the extra rows' only, once the model is known to compute logits as
        # lm_head(hidden states); every row the first time (to check that, eagerly) and always
        # for models that do not
        known = self._lazy_head is not None
        keep: int | torch.Tensor = torch.cat([torch.zeros(1, dtype=torch.long, device=self.device),
                                              torch.arange(width, width + m, device=self.device)]) \
            if self._lazy_head else width + m
        extra_layers = () if hidden == (LAST_LAYER,) else hidden  # the last layer is taken once
        logits, out = self.forward_masked(input_ids, positions, visible, keep=keep, hidden=(LAST_LAYER, *extra_layers),
                                          step=known, layout=layout)
        assert out is not None
        states = out[: n + 1, : self.hidden_size]  # (n + 1, H)
        layers = (out[: n + 1, self.hidden_size :] if extra_layers else states) if hidden else None
        extra_logits = logits[-m:] if m else None  # (m, V)
        if self._lazy_head is None:
            self._lazy_head = head_reproduces(self.config, self.lm_head, states, logits[: n + 1])
            return TreeLogits(states, self.lm_head, logits[: n + 1], states=layers, extra=extra_logits)
        return TreeLogits(states, self.lm_head, None, logits[0], layers, extra_logits) if self._lazy_head else \
            TreeLogits(states, self.lm_head, logits[: n + 1], states=layers, extra=extra_logits)

    def forward_masked(self, input_ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                       keep: int | torch.Tensor, hidden: tuple[int, ...] = (), step: bool = True,
                       layout: TreeLayout | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run input_ids [m] at `positions` [m], row r attending to the cache entries and new rows
        where visible[r] [mask_width(m)] is True; the m rows are appended to the cache. `hidden`
        as in `forward`.

        The general form of a tree forward, for drafters that grow a tree level by level in
        their own cache. A fixed-shape step unless `step` is false. Needs `tree_obstacle` None;
        a model with linear-attention layers takes trees only (`forward_tree`, which passes their
        `layout`: whom each row continues), since a recurrent state follows one path.
        """
        obstacle = self.tree_obstacle
        if obstacle is not None:
            raise ValueError(f"{type(self.model).__name__} cannot run a tree forward: {obstacle}")
        if layout is None and self._kv.recurrent:
            raise ValueError(f"{type(self.model).__name__} cannot run a masked forward: {self.masked_obstacle}")
        width = self.mask_width(input_ids.shape[0])
        if tuple(visible.shape) != (input_ids.shape[0], width):
            raise ValueError(f"visible must be [{input_ids.shape[0]}, {width}] (rows, mask_width), got "
                             f"{tuple(visible.shape)}")
        mask = self._masks(visible.to(self.device), positions)  # (1, 1, m, width), or one per kind of layer
        return self._run(input_ids, keep, hidden, mask=mask, positions=positions[None], step=step,
                         layout=layout if layout is not None else CHAIN)

    def chain(self, fn: Callable[..., Any], rows: int, *args: Any, eager: bool = False) -> Any:
        """`fn(model, cache, *args)`, a drafter's loop of forwards that appends `rows` positions
        to a static cache, run as one fixed-shape step (one compiled graph when compiling);
        `eager` runs it uncompiled (a shape met once)."""
        kv = self._kv
        if not kv.static:
            raise ValueError(f"{type(self.model).__name__} has a dynamic cache; run its forwards one by one")
        kv.reserve(rows, CHAIN)
        if eager or not kv.initialized:  # transformers allocates a static cache on its first write: never compiled
            out = fn(self.model, kv.cache, *args)
        else:
            name = f"the {type(self.model).__name__} draft loop{self._role}"
            out = step_for(self._chains, fn, name, self._compile, self.model, args, self._restore)(kv.cache, *args)
        kv.advanced(rows)
        return out

    def fed_chain(self, fn: Callable[..., Any], input_ids: torch.Tensor, rows: int, chain_rows: int, *args: Any
                  ) -> Any:
        """Feed input_ids [n] (padded to `rows` positions, as `forward` pads them) and run a
        drafter's loop `fn(model, cache, logits, *args)` from the logits of the last of them [1, V],
        which appends `chain_rows` positions: one fixed-shape step, one compiled graph when
        compiling, where `forward` and `chain` take two. Inside the step the cache is rolled back
        to the n real positions before the loop runs, so the loop overwrites the padding. A cache
        not yet allocated (a first generation whose prefill fed nothing) takes the two steps
        eagerly, a shape met once; a model whose forwards need explicit masks (pipelined) takes
        them as fixed-shape steps."""
        kv = self._kv
        n = input_ids.shape[0]
        if not kv.static:
            raise ValueError(f"{type(self.model).__name__} has a dynamic cache; run its forwards one by one")
        if rows < n:
            raise ValueError(f"rows ({rows}) must be at least the {n} ids fed")
        if not kv.initialized or self.pipelined:
            first = not kv.initialized
            logits, _ = self.forward(input_ids, keep=1, rows=rows)
            return self.chain(fn, chain_rows, logits, *args, eager=first)
        base = kv.length
        kv.reserve(max(rows, n + chain_rows), CHAIN)
        padded = _pad_ids(input_ids, rows)  # (rows,)
        inputs = (padded, self._table_positions(rows))  # padding rows sit at a learned table's last entry
        where = torch.tensor([base + n, n - 1]).to(self.device, non_blocking=True)  # (2,): real length, last row
        name = f"the {type(self.model).__name__} feed and draft loop{self._role}"
        step = step_for(self._chains, fed_step(_logits_feed, fn), name, self._compile, self.model,
                        (where, inputs, *args), self._restore)
        out = step(kv.cache, where, inputs, *args)
        kv.advanced(n + chain_rows)
        return out

    def _restore(self) -> None:
        """Undo what a compiled forward that failed may have written: the cache's length."""
        self._kv.retreat(self._kv.length)

    def keep_path(self, base: int, rows: list[int]) -> None:
        """After a tree forward at `base`, keep positions [0, base) then base + rows (ascending)."""
        self._kv.gather(base, rows)

    def discard(self, length: int) -> None:
        """Drop the positions past `length` without committing any (a rollback commits): rows a
        hybrid model kept since its last commit stay kept. For measuring a step and undoing it."""
        self._kv.retreat(length)

    @property
    def recurrent(self) -> bool:
        """Whether linear-attention layers keep their state per row on this cache (`specdec.runtime.linear`)."""
        return self._kv.recurrent

    @property
    def masked_obstacle(self) -> str | None:
        """Why this model cannot run rows of arbitrary visibility (None when it can): a drafter's
        extra rows in a verify, or `forward_masked` for a tree grown level by level."""
        if self.tree_obstacle is not None:
            return self.tree_obstacle
        if self._kv.recurrent:
            return ("its linear-attention layers follow one path per row, so a row seeing several rows at once has no "
                    "state to start from (it runs trees whole, with forward_tree)")
        return None

    def _tree_layout(self, parents: list[int], width: int) -> TreeLayout | None:
        """The linear-attention layout of a tree forward of `width` rows: the root continues the
        cached prefix, each node its parent, a padding row the root (None without such layers)."""
        kv = self._kv
        if not kv.recurrent:
            return None
        rows = [-1] + [parent + 1 if parent >= 0 else 0 for parent in parents]
        return tree_layout(rows + [0] * (width - len(rows)), kv.kernel, self.device)

    @property
    def hidden_obstacle(self) -> str | None:
        """Why this model's forwards return no hidden states (None when they do)."""
        if getattr(self.model, "_pp_stage", None) is not None:
            return ("it is split into pipeline-parallel stages, whose forwards return logits only; shard it "
                    "with tensor parallelism (--tp) for drafters that read the target's hidden states")
        return None

    def _run(self, input_ids: torch.Tensor, keep: int | torch.Tensor, hidden: tuple[int, ...],
             mask: torch.Tensor | dict[str, torch.Tensor] | None = None, positions: torch.Tensor | None = None,
             step: bool = False, layout: str | TreeLayout | None = None, prompt: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward; `layout` (CHAIN or a TreeLayout) keeps each row's linear-attention state
        until the commit, None commits the rows at once (a prefill, a replay). `prompt`: a prompt's
        forward, on a quantized model's prompt kernels (`whole_prompt`)."""
        kv = self._kv
        kv.reserve(input_ids.shape[0], layout)
        if mask is None and self.pipelined:
            mask, positions = self._causal(input_ids.shape[0], positions)
        if positions is None and step and kv.static:  # padding rows may run past a learned position table
            positions = self._table_positions(input_ids.shape[0])
        args = (kv.cache, input_ids, keep, hidden, mask, positions)
        run = self._step if step and kv.initialized else None  # a first write allocates: never compiled
        with whole_prompt() if prompt else contextlib.nullcontext():  # a prompt's forward: compared with nothing
            out = run(*args) if run is not None else model_forward(self.model, *args)
        kv.advanced(input_ids.shape[0], positions)
        return out

    def _table_positions(self, n: int) -> torch.Tensor | None:
        """Position ids [1, n] of n rows after the cached prefix on a learned position table, the
        rows past its end at its last entry; None for rotary models (positions follow the cache)."""
        if not (self.learned_positions and self.max_positions):
            return None
        rows = torch.arange(n, device=self.device) + self._kv.length  # (n,)
        return rows.clamp(max=self.max_positions - 1)[None]

    def _causal(self, n: int, positions: torch.Tensor | None
                ) -> tuple[torch.Tensor | dict[str, torch.Tensor], torch.Tensor]:
        """The explicit causal mask [1, 1, n, mask_width(n)] and position ids [1, n] of n rows fed
        after the cached prefix (`positions` kept when given)."""
        base = self._kv.length
        rows = torch.arange(n, device=self.device) + base  # (n,)
        columns = torch.arange(self.mask_width(n), device=self.device)  # (W,)
        visible = columns[None] <= rows[:, None]  # (n, W): the prefix, the earlier rows, itself
        if positions is None:
            positions = self._table_positions(n)  # padding past a learned table
        positions = rows[None] if positions is None else positions  # (1, n)
        return self._masks(visible, positions[0]), positions

    def _masks(self, visible: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """The additive mask [1, 1, m, W] of m rows at positions [m] seeing the columns visible
        [m, W] names; a sliding layer's sees only the columns within its window
        (`specdec.runtime.windows`), and models that mix kinds of layer take one mask per kind."""
        kv = self._kv
        keys = kv.key_positions(positions[None])  # (1, W) on the cache's device, which a pipeline may not share
        return layer_masks(kv.attention, visible[None], positions[None], None if keys is None else keys.to(self.device),
                           self.dtype)

    def rollback(self, length: int) -> None:
        """Keep the first `length` cached positions, exactly, and commit them.

        Hybrid models can go back to any position since the last commit: the last rollback,
        `keep_path` or reset, or on the static cache the last forward that kept no rows (a prefill).
        """
        kv = self._kv
        if self._replay is None or length == kv.length:
            kv.rollback(length)
        else:  # under the caller's grad mode
            self._replay.rollback(kv, length, lambda ids: self._run(ids, keep=1, hidden=()))
        if self._replay is not None:
            self._replay.clear()


_SHARED: weakref.WeakKeyDictionary[PreTrainedModel, KV] = weakref.WeakKeyDictionary()  # model -> its shared cache


def _pad_ids(input_ids: torch.Tensor, rows: int) -> torch.Tensor:
    """input_ids [n] padded with zeros to `rows` (>= n) positions."""
    n = input_ids.shape[0]
    return torch.cat([input_ids, input_ids.new_zeros(rows - n)]) if rows > n else input_ids


def _logits_feed(model: PreTrainedModel, cache: Cache, where: torch.Tensor,
                 inputs: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
    """`CausalLM.fed_chain`'s feed (`fed_step`): the forward of the padded ids at their positions
    (None: from the cache's length), keeping the logits of the last real one (where[1]); (1, V)."""
    input_ids, positions = inputs
    return model_forward(model, cache, input_ids, where[1:], (), None, positions)[0]
