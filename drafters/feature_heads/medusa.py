"""Medusa heads as a drafter: extra decoding heads on the target's last hidden state (Cai et al.
2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads"); the
module is `specdec.drafters.feature_heads.medusa_head`, its checkpoints
`specdec.drafters.feature_heads.medusa_files`.

Head i (0-based) proposes the token i+1 places after tokens[-1]: in the loop's terms, the last row
of `ctx.hidden_states` belongs to tokens[-2]. Each step runs the heads once over the newest hidden
row of every row that drafts, stacked [B', H] (B' padded to the next power of two when compiled,
so a generation keeps a few shapes), then makes each row's draft.

Chain mode (the default): the draft is each head's top-1 (deterministic, one-hot q; one argmax
for every row), or with `sample=True` a token drawn from each head's processed distribution with
the row's own generator (from the committed ids and the tokens drafted before it when the sampling
reads the prefix), reported as q.

Tree mode (Cai et al. 2024, §2.1.2, tree attention): `medusa_choices` lists the tree's paths in the
public Medusa format, tuples of top-k ranks: (i,) is head 0's i-th most likely token, (i, j) head
1's j-th most likely token under it, and so on; `tree=True` (or `medusa_choices="default"`) uses
`default_medusa_choices` for the checkpoint's heads. Each step takes one top-k over the ranks the
trees need (for every row at once) and returns each row's nodes breadth-first, paths deeper than
its k dropped. Siblings are distinct top-k candidates, deterministic (no probs) at any
temperature: the verifier's sample-and-match keeps that lossless. When the tree holds (0,),
(0, 0), ..., its first path is the chain mode's draft. With `sample=True` at temperature > 0 the
tree has the choices' shape and each node's children are drawn from the head of their depth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from specdec.drafters.feature_heads.medusa_choices import (DEFAULT_MAX_RANK, PRESETS, ChoiceLayout,
                                                           check_medusa_choices, choice_layout, default_medusa_choices)
from specdec.drafters.feature_heads.medusa_files import check_shapes, expected_shapes, read_medusa
from specdec.drafters.feature_heads.medusa_head import MedusaHeads
from specdec.drafters.tree_search.dynamic import SAMPLED_SIBLINGS, draw_siblings
from specdec.protocols import Capability, DraftContext, Rows
from specdec.runtime.engine import Step
from specdec.runtime.forward import LAST_LAYER
from specdec.runtime.target import CausalLM
from specdec.sampling import probabilities
from specdec.trees import children
from specdec.types import Draft

__all__ = ["MedusaDrafter", "check_medusa_choices", "default_medusa_choices"]


def _heads_forward(heads: MedusaHeads, hidden: torch.Tensor) -> torch.Tensor:
    return heads(hidden)  # (K, N, V) for hidden (N, H)


def _fit_heads(heads: MedusaHeads, file: Path, ctx: DraftContext) -> None:
    """Check that `heads` fit ctx's target (hidden size, vocabulary), naming `file` when they do
    not, and move them to the target's device and dtype."""
    target = ctx.target
    expected = expected_shapes(heads.num_heads, heads.num_layers, target.hidden_size, ctx.vocab_size)
    check_shapes(dict(heads.state_dict()), expected, file,
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
                         "hidden states to a drafter that declares Capability.HIDDEN_STATES")
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


def _sampled_tree(logits: torch.Tensor, layout: ChoiceLayout, ctx: DraftContext, siblings: str) -> Draft:
    """The choices' tree with sampled nodes from the heads' logits [heads used, V]: each node's
    children drawn from the processed distribution of the head of their depth (from the node's
    own path when the settings read the prefix), as `siblings` says (`draw_siblings`); a child
    the draw could not give is dropped with its subtree."""
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
        for node, token in zip(group, draw_siblings(q, len(group), siblings, ctx.generator)):
            placed[node] = len(tokens)
            paths.append(path + [token])
            tokens.append(token)
            parents.append(placed[parent] if parent >= 0 else -1)
            rows.append(q)
    device = logits.device
    return Draft(torch.tensor(tokens, dtype=torch.long, device=device), torch.stack(rows),
                 torch.tensor(parents, dtype=torch.long, device=device), siblings=siblings)


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
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.STATE, Capability.HIDDEN_STATES,
                                                               Capability.TREES})
    tree_options: ClassVar[dict[str, Any]] = {"tree": True}  # the options that make it draft trees (bench rows)

    @staticmethod
    def drafts_trees(options: dict[str, Any]) -> bool:
        """Whether these options make it draft trees (tree=True or any medusa_choices)."""
        return options.get("tree") is True or options.get("medusa_choices") is not None

    def __init__(self, path: str | Path, sample: bool = False, tree: bool = False,
                 medusa_choices: Sequence[Sequence[int]] | str | None = None, siblings: str = "without_replacement") -> None:
        self.heads, self.file = read_medusa(path)
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
        self._last: dict[int, torch.Tensor] = {}  # row -> (1, H) hidden state of its tokens[-2]
        self._step = Step(_heads_forward, "the Medusa heads", False, self.heads)

    def max_draft_nodes(self, k: int) -> int:
        return min(k, self.heads.num_heads) if self.choices is None else len(self.choices)

    def hidden_layers(self, target: CausalLM) -> tuple[int, ...]:
        return (LAST_LAYER,)  # the post-norm last layer

    def prefill(self, rows: Rows) -> None:
        first = rows[min(rows)]  # every row's target and engine
        _fit_heads(self.heads, self.file, first)
        if self._step.compiled != first.engine.compile:
            self._step = Step(_heads_forward, "the Medusa heads", first.engine.compile, self.heads)
        self._last = {}
        self._remember(rows)

    def commit(self, rows: Rows, accepted: Mapping[int, int]) -> None:
        # The loop gathers the accepted path's hidden rows (ctx.accepted's nodes) in order, so
        # the newest row is still that of tokens[-2], for a tree as for a chain.
        self._remember(rows)

    def propose(self, rows: Rows, k: Mapping[int, int]) -> dict[int, Draft]:
        self._remember(rows)
        counts = {row: min(k[row], self.heads.num_heads) for row in rows}
        live = [row for row in rows if counts[row] > 0 and row in self._last]
        drafts = {row: Draft(ctx.tokens[:0]) for row, ctx in rows.items() if row not in live}
        if not live:
            return drafts
        logits = self._logits([self._last[row] for row in live])  # (K, B', V)
        sampled = self.sample and not rows[live[0]].sampling.greedy
        if self.choices is not None:
            layouts = [self._layout(counts[row], logits.device) for row in live]
            if sampled:
                drafts.update({row: _sampled_tree(logits[: layout.count, i], layout, rows[row], self.siblings)
                               for i, (row, layout) in enumerate(zip(live, layouts))})
                return drafts
            used = max(layout.count for layout in layouts)
            top = logits[:used].topk(max(layout.ranks for layout in layouts), dim=-1).indices  # (heads, B', ranks)
            drafts.update({row: _tree_draft(top[:, i], layout) for i, (row, layout) in enumerate(zip(live, layouts))})
        elif sampled:
            drafts.update({row: _sampled_chain(logits[: counts[row], i], rows[row]) for i, row in enumerate(live)})
        else:
            best = logits[: max(counts[row] for row in live)].argmax(dim=-1).T  # (B', k')
            drafts.update({row: Draft(best[i, : counts[row]]) for i, row in enumerate(live)})
        return drafts

    def _layout(self, depth: int, device: torch.device) -> ChoiceLayout:
        """The choices' layout at most `depth` deep on `device` (kept across proposes)."""
        assert self.choices is not None
        key = (depth, device)
        if key not in self._layouts:
            self._layouts[key] = choice_layout(self.choices, depth, device)
        return self._layouts[key]

    def _remember(self, rows: Rows) -> None:
        """Keep each row's newest hidden row (an empty block, from a 1-token prompt, keeps the one before)."""
        for row, ctx in rows.items():
            newest = _newest_hidden(ctx, self._last.get(row))
            if newest is not None:
                self._last[row] = newest  # (1, H)

    def _logits(self, hidden: list[torch.Tensor]) -> torch.Tensor:
        """Every head's logits [K, B', V] at the rows' newest hidden rows (B' of them, each (1, H); all
        heads: one shape whatever k)."""
        stacked = torch.cat(hidden)  # (B', H)
        rows = stacked.shape[0]
        if self._step.compiled:  # a few shapes: the next power of two
            size = 1 << (rows - 1).bit_length()
            stacked = torch.cat([stacked, stacked.new_zeros(size - rows, stacked.shape[1])])  # (size, H)
        with torch.no_grad():
            return self._step(stacked)[:, :rows]
