"""Medusa heads: extra decoding heads on the target's last hidden state (Cai et al. 2024,
"Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads").

Head i (0-based) maps the hidden state at position t (whose own LM head gave token t+1) to
token t+2+i: L residual blocks `x + SiLU(W x + b)`, then a bias-free projection to the
vocabulary. In the loop's terms, the last row of `ctx.hidden_states` belongs to tokens[-2],
so head i proposes the token i+1 places after tokens[-1].

Chain mode (the default): the draft is each head's top-1 (deterministic, one-hot q), or with
`sample=True` a token drawn from each head's processed distribution, reported as q.

Tree mode (Cai et al. 2024, §2.1.2, tree attention): `medusa_choices` lists the tree's paths
in the public Medusa format, tuples of top-k ranks: (i,) is head 0's i-th most likely token,
(i, j) head 1's j-th most likely token under it, and so on; `tree=True` (or
`medusa_choices="default"`) uses `default_medusa_choices` for the checkpoint's heads. Each
propose runs the heads once and one top-k over the ranks the tree needs, and returns the
nodes breadth-first, paths deeper than k dropped. Siblings are distinct top-k candidates,
deterministic (no probs) at any temperature: the verifier's sample-and-match keeps that
lossless. When the tree holds (0,), (0, 0), ..., its first path is the chain mode's draft.

In a batch (`specdec.generate_batch`) the drafter's batched form, `MedusaBatch`, runs the heads
once per batch step over every live row's newest hidden row, then makes each row's chain or
tree as `propose` makes it (`specdec.decoding.batch_drafters`); sampled trees and sampled
chains whose sampling reads the prefix run row by row.

Checkpoint format (the public Medusa-1 layout): a directory with `config.json`
(`medusa_num_heads`, `medusa_num_layers`, optionally `hidden_size`, `vocab_size`) and
`medusa_lm_head.safetensors` or `medusa_lm_head.pt`, keys `{h}.{l}.linear.weight`,
`{h}.{l}.linear.bias` for l < L and `{h}.{L}.weight` for the vocabulary projection.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from specdec.checkpoints import resolve_checkpoint
from specdec.drafters.medusa_choices import (DEFAULT_MAX_RANK, PRESETS, ChoiceLayout, check_medusa_choices,
                                             choice_layout, default_medusa_choices)
from specdec.drafters.tree_search import SAMPLED_SIBLINGS, draw_siblings
from specdec.protocols import DraftContext
from specdec.runtime.engine import Step
from specdec.sampling import probabilities
from specdec.trees import children
from specdec.types import Draft

__all__ = ["MedusaBatch", "MedusaDrafter", "MedusaHeads", "check_medusa_choices", "default_medusa_choices",
           "load_medusa", "save_medusa"]

CONFIG = "config.json"
SAFETENSORS = "medusa_lm_head.safetensors"
TORCH = "medusa_lm_head.pt"


class ResBlock(nn.Module):
    """x + SiLU(W x + b), H -> H."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads of L residual blocks and a vocabulary projection; state-dict keys are the
    public Medusa ones (`{h}.{l}.linear.weight|bias`, `{h}.{L}.weight`)."""

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        for field, value, least in (("num_heads", num_heads, 1), ("num_layers", num_layers, 0),
                                    ("hidden_size", hidden_size, 1), ("vocab_size", vocab_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"medusa: {field} must be an int >= {least}, got {value!r}")
        self.num_heads, self.num_layers = num_heads, num_layers
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        for h in range(num_heads):
            blocks = [ResBlock(hidden_size) for _ in range(num_layers)]
            self.add_module(str(h), nn.Sequential(*blocks, nn.Linear(hidden_size, vocab_size, bias=False)))

    def forward(self, hidden: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """Logits [count, ..., V] of the first `count` heads (default all) for hidden [..., H]."""
        heads = list(self.children())[: self.num_heads if count is None else count]
        return torch.stack([head(hidden) for head in heads])


def expected_shapes(num_heads: int, num_layers: int, hidden_size: int,
                    vocab_size: int) -> dict[str, tuple[int, ...]]:
    """Every key of the Medusa layout and its shape, in state-dict order."""
    shapes: dict[str, tuple[int, ...]] = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            shapes[f"{h}.{layer}.linear.weight"] = (hidden_size, hidden_size)
            shapes[f"{h}.{layer}.linear.bias"] = (hidden_size,)
        shapes[f"{h}.{num_layers}.weight"] = (vocab_size, hidden_size)
    return shapes


def _check_shapes(tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], file: Path,
                  hint: str) -> None:
    """Raise naming the file, the first bad key and both shapes; `hint` says what to do."""
    for key, shape in expected.items():
        if key not in tensors:
            present = ", ".join(sorted(tensors)[:8]) + (", ..." if len(tensors) > 8 else "")
            raise KeyError(f"medusa: {file}: key {key!r} is missing (expected shape {shape}); the file "
                           f"holds [{present}]; {hint}")
        actual = tuple(tensors[key].shape)
        if actual != shape:
            raise ValueError(f"medusa: {file}: key {key!r} has shape {actual}, expected {shape}; {hint}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise ValueError(f"medusa: {file}: unexpected keys {unexpected[:8]} for a checkpoint of "
                         f"{len(expected)} tensors; {hint}")


def _read_config(directory: Path) -> dict[str, int]:
    path = directory / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"medusa: {path} not found; a Medusa checkpoint directory needs {CONFIG} "
                                "with medusa_num_heads and medusa_num_layers")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"medusa: {path} is not valid JSON: {error}") from None
    config: dict[str, int] = {}
    for field in ("medusa_num_heads", "medusa_num_layers", "hidden_size", "vocab_size"):
        value = raw.get(field) if isinstance(raw, dict) else None
        if value is None and field.startswith("medusa_"):
            raise ValueError(f"medusa: {path} has no {field!r}; add it (the number of Medusa "
                             f"{'heads' if field.endswith('heads') else 'residual blocks per head'})")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < (0 if field == "medusa_num_layers" else 1)):
            least = 0 if field == "medusa_num_layers" else 1
            raise ValueError(f"medusa: {path}: {field} must be an int >= {least}, got {value!r}")
        if value is not None:
            config[field] = value
    return config


def _read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The tensors of the weights file (safetensors preferred) and its path."""
    if (directory / SAFETENSORS).is_file():
        from safetensors.torch import load_file

        file = directory / SAFETENSORS
        return load_file(str(file)), file
    if (directory / TORCH).is_file():
        file = directory / TORCH
        state = torch.load(file, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ValueError(f"medusa: {file} does not hold a state dict of tensors")
        return dict(state), file
    raise FileNotFoundError(f"medusa: {directory} holds neither {SAFETENSORS} nor {TORCH}")


def _load(path: str | Path) -> tuple[MedusaHeads, Path]:
    directory = resolve_checkpoint(path, "medusa heads")
    config = _read_config(directory)
    tensors, file = _read_weights(directory)
    heads, layers = config["medusa_num_heads"], config["medusa_num_layers"]
    projection = tensors.get(f"0.{layers}.weight")  # (V, H): sizes the config may omit
    if projection is None and not {"hidden_size", "vocab_size"} <= set(config):
        raise KeyError(f"medusa: {file}: key '0.{layers}.weight' (the first head's vocabulary "
                       f"projection) is missing, and {CONFIG} gives no hidden_size / vocab_size")
    inferred = tuple(projection.shape) + (0, 0) if projection is not None else (0, 0)
    vocab_size = config.get("vocab_size", inferred[0])
    hidden_size = config.get("hidden_size", inferred[1])
    hint = (f"the checkpoint declares {heads} heads of {layers} blocks, hidden size {hidden_size}, "
            f"vocabulary {vocab_size} ({CONFIG}, else key '0.{layers}.weight')")
    _check_shapes(tensors, expected_shapes(heads, layers, hidden_size, vocab_size), file, hint)
    integral = sorted(key for key, tensor in tensors.items() if not tensor.is_floating_point())
    if integral:
        raise ValueError(f"medusa: {file}: keys {integral[:8]} are not floating point")
    model = MedusaHeads(heads, layers, hidden_size, vocab_size).to(tensors[f"0.{layers}.weight"].dtype)
    model.load_state_dict(tensors)
    return model.eval(), file


def load_medusa(path: str | Path) -> MedusaHeads:
    """Read a Medusa checkpoint directory (CPU, the file's dtype)."""
    return _load(path)[0]


def save_medusa(heads: MedusaHeads, path: str | Path, safe: bool = True) -> None:
    """Write `heads` as a Medusa checkpoint directory (safetensors, or a torch state dict),
    replacing a checkpoint already there in either format."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers,
              "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size}
    (directory / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    state = {key: tensor.detach().cpu().contiguous() for key, tensor in heads.state_dict().items()}
    (directory / (TORCH if safe else SAFETENSORS)).unlink(missing_ok=True)  # loading prefers safetensors
    if safe:
        from safetensors.torch import save_file

        save_file(state, str(directory / SAFETENSORS))
    else:
        torch.save(state, directory / TORCH)


def _heads_forward(heads: MedusaHeads, hidden: torch.Tensor) -> torch.Tensor:
    return heads(hidden)  # (K, N, V) for hidden (N, H)


def _fit_heads(heads: MedusaHeads, file: Path, ctx: DraftContext) -> None:
    """Check that `heads` fit ctx's target (hidden size, vocabulary), naming `file` when they do
    not, and move them to the target's device and dtype."""
    target = ctx.target
    expected = expected_shapes(heads.num_heads, heads.num_layers, target.hidden_size, ctx.vocab_size)
    _check_shapes(dict(heads.state_dict()), expected, file,
                  f"the target has hidden size {target.hidden_size} and vocabulary {ctx.vocab_size}; "
                  "use Medusa heads trained for this target")
    first = next(heads.parameters())
    if (first.device, first.dtype) != (target.device, target.dtype):
        with torch.inference_mode(False), torch.no_grad():  # ordinary tensors, trainable later
            heads.to(device=target.device, dtype=target.dtype)


def _newest_hidden(ctx: DraftContext, last: torch.Tensor | None) -> torch.Tensor | None:
    """The newest hidden row (1, H) of ctx, that of tokens[-2]; `last` when ctx's block is empty
    (a 1-token prompt adds none)."""
    if ctx.hidden_states is None:
        raise ValueError("medusa: ctx.hidden_states is None; the decode loop must pass the target's "
                         "hidden states to drafters with uses_hidden_states = True")
    return ctx.hidden_states[-1:] if ctx.hidden_states.shape[0] > 0 else last  # (1, H)


def _sampled_chain(logits: torch.Tensor, ctx: DraftContext) -> Draft:
    """One token per head drawn from ctx.generator, head i's from its processed distribution
    (logits [k', V]; from the committed ids and the i tokens drafted before it when the sampling
    reads the prefix), reported as q [k', V]."""
    if ctx.sampling.reads_prefix:  # head i's q from the committed ids and the i tokens drafted before it
        drafted: list[int] = []
        rows = []
        for i in range(logits.shape[0]):
            q_i = ctx.probabilities(logits[i : i + 1], [drafted])  # (1, V)
            drafted.append(int(torch.multinomial(q_i[0], 1, generator=ctx.generator)))
            rows.append(q_i)
        return Draft(torch.tensor(drafted, device=logits.device), torch.cat(rows))
    q = probabilities(logits, ctx.sampling)  # (k', V)
    tokens = torch.multinomial(q, 1, generator=ctx.generator).squeeze(-1)  # (k',)
    return Draft(tokens, q)


def _tree_draft(top: torch.Tensor, layout: ChoiceLayout) -> Draft:
    """The layout's nodes, breadth-first, from the heads' top-k ids [heads used, ranks]."""
    return Draft(top[layout.heads, layout.rank_of], parents=layout.parents)


class MedusaDrafter:
    """Drafts min(k, K) tokens, one per head, from the Medusa checkpoint at `path` (a
    directory or a hub id), or a Medusa tree of the heads' top-k candidates.

    sample: draw from each head's processed distribution (reported as q) when the sampling
    is not greedy; by default drafts are each head's argmax, a tree's nodes its top-k.
    medusa_choices: the tree's paths of top-k ranks, e.g. [(0,), (1,), (0, 0), (0, 1)], or
    "default"; tree: True for the default tree (`default_medusa_choices`). A sampled tree has
    the choices' shape, each node's children drawn from the head of their depth: distinct
    (siblings="without_replacement", the default; a group the processed distribution cannot
    fill keeps fewer) or i.i.d. (siblings="iid"). The heads follow the target's device and dtype.
    """

    name: ClassVar[str] = "medusa"
    tree_options: ClassVar[dict[str, Any]] = {"tree": True}  # the options that make it draft trees (bench rows)

    @staticmethod
    def drafts_trees(options: dict[str, Any]) -> bool:
        """Whether these options make it draft trees (tree=True or any medusa_choices)."""
        return options.get("tree") is True or options.get("medusa_choices") is not None
    uses_hidden_states: ClassVar[bool] = True

    def __init__(self, path: str | Path, sample: bool = False, tree: bool = False,
                 medusa_choices: Sequence[Sequence[int]] | str | None = None, siblings: str = "without_replacement") -> None:
        self.heads, self.file = _load(path)
        self.sample = bool(sample)
        if siblings not in SAMPLED_SIBLINGS:
            raise ValueError(f"medusa: siblings must be one of {', '.join(map(repr, SAMPLED_SIBLINGS))}, "
                             f"got {siblings!r}")
        self.siblings = siblings
        if not isinstance(tree, bool):
            raise ValueError(f"medusa: tree must be true or false, got {tree!r}")
        if isinstance(medusa_choices, str):
            if medusa_choices not in PRESETS:
                raise ValueError(f"medusa: medusa_choices preset {medusa_choices!r} is unknown; use one of "
                                 f"{list(PRESETS)} or a list of paths such as [(0,), (1,), (0, 0)]")
            medusa_choices, tree = None, True
        self.choices: list[tuple[int, ...]] | None = None
        if medusa_choices is not None:
            self.choices = check_medusa_choices(medusa_choices, self.heads.num_heads, self.heads.vocab_size)
        elif tree:
            self.choices = default_medusa_choices(self.heads.num_heads,
                                                  max_rank=min(DEFAULT_MAX_RANK, self.heads.vocab_size))
        self._layouts: dict[tuple[int, torch.device], ChoiceLayout] = {}
        self._last: torch.Tensor | None = None  # (1, H) hidden state of tokens[-2]
        self._step = Step(_heads_forward, "the Medusa heads", False, self.heads)

    def max_draft_nodes(self, k: int) -> int:
        return min(k, self.heads.num_heads) if self.choices is None else len(self.choices)

    def batch_form(self, rows: int) -> MedusaBatch:
        """The batched form for `rows` rows (`MedusaBatch`): one pass of the heads per batch step."""
        return MedusaBatch(self)

    def prefill(self, ctx: DraftContext) -> None:
        _fit_heads(self.heads, self.file, ctx)
        self._last = None
        self._step = Step(_heads_forward, "the Medusa heads", ctx.engine.compile, self.heads)
        self._remember(ctx)

    def _logits(self) -> torch.Tensor:
        """Every head's logits [K, V] at the newest hidden row (all heads: one shape whatever k)."""
        assert self._last is not None
        with torch.no_grad():
            return self._step(self._last)[:, 0]

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self._remember(ctx)
        count = min(k, self.heads.num_heads)
        if self._last is None or count <= 0:
            return Draft(ctx.tokens[:0])
        if self.choices is not None:
            if self.sample and not ctx.sampling.greedy:
                return self._propose_sampled_tree(ctx, count)
            return self._propose_tree(count)
        logits = self._logits()[:count]  # (k', V)
        if self.sample and not ctx.sampling.greedy:
            return _sampled_chain(logits, ctx)
        return Draft(logits.argmax(dim=-1))

    def _layout(self, depth: int, device: torch.device) -> ChoiceLayout:
        """The choices' layout at most `depth` deep on `device` (kept across proposes)."""
        assert self.choices is not None
        key = (depth, device)
        if key not in self._layouts:
            self._layouts[key] = choice_layout(self.choices, depth, device)
        return self._layouts[key]

    def _propose_tree(self, depth: int) -> Draft:
        """The choices at most `depth` deep: one pass of the heads, one top-k, breadth-first."""
        assert self._last is not None
        layout = self._layout(depth, self._last.device)
        logits = self._logits()[: layout.count]  # (heads used, V)
        return _tree_draft(logits.topk(layout.ranks, dim=-1).indices, layout)  # top: (heads used, ranks)

    def _propose_sampled_tree(self, ctx: DraftContext, depth: int) -> Draft:
        """The choices' tree at most `depth` deep with sampled nodes: each node's children drawn
        from the processed distribution of the head of their depth (from the node's own path when
        the settings read the prefix), as `self.siblings` says (`draw_siblings`); a child the
        draw could not give is dropped with its subtree."""
        assert self._last is not None and self.choices is not None
        layout = choice_layout(self.choices, depth, self._last.device)
        logits = self._logits()[: layout.count]  # (heads used, V)
        shared = None if ctx.sampling.reads_prefix else probabilities(logits, ctx.sampling)  # (heads used, V)
        heads = layout.heads.tolist()
        placed: dict[int, int] = {}  # choice node -> draft node
        paths: list[list[int]] = []  # each draft node's tokens from the root
        tokens: list[int] = []
        parents: list[int] = []
        rows: list[torch.Tensor] = []
        for row, group in enumerate(children(layout.parents.tolist())):
            parent = row - 1
            if not group or (parent >= 0 and parent not in placed):
                continue
            head = heads[group[0]]
            path = paths[placed[parent]] if parent >= 0 else []
            q = shared[head] if shared is not None else ctx.probabilities(logits[head : head + 1], [path])[0]  # (V,)
            for node, token in zip(group, draw_siblings(q, len(group), self.siblings, ctx.generator)):
                placed[node] = len(tokens)
                paths.append(path + [token])
                tokens.append(token)
                parents.append(placed[parent] if parent >= 0 else -1)
                rows.append(q)
        device = self._last.device
        return Draft(torch.tensor(tokens, dtype=torch.long, device=device), torch.stack(rows),
                     torch.tensor(parents, dtype=torch.long, device=device), siblings=self.siblings)

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        # The loop gathers the accepted path's hidden rows (ctx.accepted's nodes) in order, so
        # the newest row is still that of tokens[-2], for a tree as for a chain.
        self._remember(ctx)

    def _remember(self, ctx: DraftContext) -> None:
        """Keep the newest hidden row (an empty block, from a 1-token prompt, adds none)."""
        self._last = _newest_hidden(ctx, self._last)  # (1, H)


class MedusaBatch:
    """`MedusaDrafter`'s batched form (`specdec.decoding.batch_drafters`): each batch step runs the
    heads once over the newest hidden rows of every live row that has one, stacked [B', H] (B'
    padded to the next power of two when compiled, so a generation keeps a few shapes), then
    makes each row's draft as batch-1 `propose` does: a greedy chain (one argmax for all rows), a
    sampled chain (each row's tokens drawn from its own ctx.generator, as its batch-1 decoding
    draws them), or a deterministic tree (one top-k for all rows). Sampled trees, and sampled
    chains whose sampling reads the prefix, it leaves to one drafter per row (`serves`)."""

    def __init__(self, drafter: MedusaDrafter) -> None:
        self.drafter = drafter
        self._last: dict[int, torch.Tensor] = {}  # row -> (1, H) hidden state of its tokens[-2]
        self._step = Step(_heads_forward, "the Medusa heads", False, drafter.heads)

    def serves(self, ctx: DraftContext) -> bool:
        """False for sampled trees and for sampled chains whose sampling reads the prefix."""
        sampled = self.drafter.sample and not ctx.sampling.greedy
        return not (sampled and (self.drafter.choices is not None or ctx.sampling.reads_prefix))

    def prefill_batch(self, ctxs: dict[int, DraftContext]) -> None:
        first = ctxs[min(ctxs)]  # every row's target and engine
        _fit_heads(self.drafter.heads, self.drafter.file, first)
        self._step = Step(_heads_forward, "the Medusa heads", first.engine.compile, self.drafter.heads)
        self._last = {}
        self._remember(ctxs)

    def propose_batch(self, ctxs: dict[int, DraftContext], k: dict[int, int]) -> dict[int, Draft]:
        self._remember(ctxs)
        counts = {row: min(k.get(row, 0), self.drafter.heads.num_heads) for row in ctxs}
        live = [row for row in ctxs if counts[row] > 0 and row in self._last]
        drafts = {row: Draft(ctx.tokens[:0]) for row, ctx in ctxs.items() if row not in live}
        if not live:
            return drafts
        logits = self._logits([self._last[row] for row in live])  # (K, B', V)
        if self.drafter.choices is not None:
            layouts = [self.drafter._layout(counts[row], logits.device) for row in live]
            used = max(layout.count for layout in layouts)
            ranks = max(layout.ranks for layout in layouts)
            top = logits[:used].topk(ranks, dim=-1).indices  # (heads used, B', ranks)
            drafts.update({row: _tree_draft(top[:, i], layout) for i, (row, layout) in enumerate(zip(live, layouts))})
        elif self.drafter.sample and not ctxs[live[0]].sampling.greedy:
            drafts.update({row: _sampled_chain(logits[: counts[row], i], ctxs[row]) for i, row in enumerate(live)})
        else:
            best = logits[: max(counts[row] for row in live)].argmax(dim=-1).T  # (B', k')
            drafts.update({row: Draft(best[i, : counts[row]]) for i, row in enumerate(live)})
        return drafts

    def commit_batch(self, ctxs: dict[int, DraftContext], num_accepted: dict[int, int]) -> None:
        self._remember(ctxs)  # the accepted path's hidden rows end with that of each row's tokens[-2]

    def finish_batch(self, ctxs: dict[int, DraftContext]) -> None:
        for row in ctxs:
            self._last.pop(row, None)

    def _remember(self, ctxs: dict[int, DraftContext]) -> None:
        """Keep each row's newest hidden row (an empty block keeps the one before)."""
        for row, ctx in ctxs.items():
            newest = _newest_hidden(ctx, self._last.get(row))
            if newest is not None:
                self._last[row] = newest  # (1, H)

    def _logits(self, hidden: list[torch.Tensor]) -> torch.Tensor:
        """Every head's logits [K, B', V] at the rows' newest hidden rows (B' of them, each (1, H))."""
        stacked = torch.cat(hidden)  # (B', H)
        rows = stacked.shape[0]
        if self._step.compiled:  # a few shapes: the next power of two
            size = 1 << (rows - 1).bit_length()
            stacked = torch.cat([stacked, stacked.new_zeros(size - rows, stacked.shape[1])])  # (size, H)
        with torch.no_grad():
            return self._step(stacked)[:, :rows]
