"""Dynamic draft trees (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with
Dynamic Draft Trees", §4): grow the tree where the drafter is confident, verify the best part.

Expansion: the root's top_k tokens form depth 1. At each further depth, the top_k nodes of the
newest depth by *value* (the product of the drafter's probabilities along the path, a proxy of
the chance the target accepts the whole path) are run through the drafter in one forward, and
each gets its top_k children. Reranking: of every node generated, the `total_tokens` of highest
value form the draft. A child's value never exceeds its parent's, and ties go to the node made
first, so the kept set contains the ancestors of each of its nodes.

Candidates are deterministic (top-k), so the verifier treats siblings by sample-and-match, which
keeps sampling exact at any temperature. At temperature > 0 a drafter may instead grow a tree of
i.i.d. sampled siblings (`grow_sampled_tree`), verified by SpecInfer's residual chain. The drafter
supplies one callback that runs a depth's chosen nodes and returns their next-token logits; where
its cache puts them is its business.

This is the host-side search: the draft model's top-k trees and every drafter's sampled trees.
EAGLE, EAGLE-3 and MTP build the same top-k tree as fixed-shape tensor operations, one step
(`specdec.drafters.tree_search.graph`), which `grow_tree` is the reference for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdec.protocols import DraftContext
from specdec.sampling import probabilities
from specdec.types import Draft, Sampling

__all__ = ["SAMPLED_SIBLINGS", "DynamicTree", "TreeColumns", "TreeSearch", "draw_siblings", "grow",
           "SampledGrowth", "grow_sampled_tree", "grow_tree", "prefix_q", "tree_settings"]

SAMPLED_SIBLINGS = ("iid", "without_replacement")  # how a sampled tree draws a node's children


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2 tree settings: top_k children per expanded node and expanded nodes per depth;
    total_tokens nodes kept; depth the most levels (None: the loop's k).

    value_temperature: node values use softmax(logits / value_temperature). EAGLE-2 takes the
    drafter's own probabilities (1.0), which estimate acceptance only when the drafter is
    calibrated; a small under-confident drafter spreads its tree too wide and too shallow. The
    zoo fits this temperature on held-out text (temperature scaling, Guo et al. 2017, "On
    Calibration of Modern Neural Networks") and passes it with the drafter's options.

    siblings: how a sampled tree (temperature > 0) draws a node's children (`draw_siblings`):
    "without_replacement" (distinct children, each verified against q with its elder siblings
    removed; the default, as distinct siblings keep more) or "iid". A top-k tree's children are
    distinct deterministic candidates either way.
    """

    top_k: int = 4
    total_tokens: int = 16
    depth: int | None = None
    value_temperature: float = 1.0
    siblings: str = "without_replacement"

    def __post_init__(self) -> None:
        if self.siblings not in SAMPLED_SIBLINGS:
            raise ValueError(f"siblings must be one of {', '.join(map(repr, SAMPLED_SIBLINGS))} (how a sampled "
                             f"tree draws a node's children), got {self.siblings!r}")
        for name in ("top_k", "total_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.depth is not None and (isinstance(self.depth, bool) or not isinstance(self.depth, int)
                                       or self.depth < 1):
            raise ValueError(f"depth must be an int >= 1 or None (the loop's k), got {self.depth!r}")
        value = self.value_temperature
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(f"value_temperature must be a finite number > 0, got {value!r}")


def tree_settings(drafter: str, tree: bool, top_k: int, total_tokens: int, depth: int | None,
                  value_temperature: float = 1.0, siblings: str = "without_replacement") -> DynamicTree | None:
    """The drafter's DynamicTree when `tree` is true (None: chains); errors name the drafter."""
    if not isinstance(tree, bool):
        raise ValueError(f"{drafter}: tree must be true or false, got {tree!r}")
    try:
        settings = DynamicTree(top_k=top_k, total_tokens=total_tokens, depth=depth,
                               value_temperature=value_temperature, siblings=siblings)
    except ValueError as error:
        raise ValueError(f"{drafter}: {error}") from None
    return settings if tree else None


@dataclass
class TreeSearch:
    """The nodes generated so far (creation order, parents before children)."""

    tokens: list[int]
    parents: list[int]  # -1 for depth 1
    depths: list[int]
    values: list[float]  # log of the path's drafter probability
    rows: list[torch.Tensor] = field(default_factory=list)  # sampled trees: the q [V] each node was drawn from


Expand = Callable[[TreeSearch, list[int]], torch.Tensor]
PrefixQ = Callable[[torch.Tensor, list[list[int]]], torch.Tensor]  # (logits [f, V], each row's draft path) -> q [f, V]


def _add_children(search: TreeSearch, logits: torch.Tensor, parents: list[int], top_k: int,
                  temperature: float = 1.0) -> list[int]:
    """Add the top_k children of each parent (rows of logits [len(parents), V]); return the new ids."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)  # (f, V)
    best, ids = log_probs.topk(min(top_k, log_probs.shape[-1]), dim=-1)  # (f, top_k)
    made: list[int] = []
    for parent, values, tokens in zip(parents, best.tolist(), ids.tolist()):
        base = search.values[parent] if parent >= 0 else 0.0
        depth = search.depths[parent] + 1 if parent >= 0 else 1
        for value, token in zip(values, tokens):
            made.append(len(search.tokens))
            search.tokens.append(token)
            search.parents.append(parent)
            search.depths.append(depth)
            search.values.append(base + value)
    return made


def grow_tree(root_logits: torch.Tensor, expand: Expand, settings: DynamicTree, k: int,
              device: torch.device) -> tuple[Draft, list[int]]:
    """A dynamic tree of at most `settings.total_tokens` nodes, at most min(depth, k) deep.

    root_logits: [V] the drafter's logits for the token after the last committed one.
    expand(search, nodes) runs `nodes` (all of one depth, each with its ancestors already run)
    and returns their next-token logits [len(nodes), V].
    Returns the draft and, for each of its nodes, its id in the search.
    """
    depth = min(k, settings.depth) if settings.depth is not None else k
    search = TreeSearch([], [], [], [])
    if depth < 1:
        return Draft(torch.empty(0, dtype=torch.long, device=device)), []
    newest = _add_children(search, root_logits[None], [-1], settings.top_k, settings.value_temperature)
    for _ in range(depth - 1):
        frontier = sorted(newest, key=lambda node: (-search.values[node], node))[: settings.top_k]
        frontier.sort()  # creation order: the callback sees them as made
        newest = _add_children(search, expand(search, frontier), frontier, settings.top_k,
                               settings.value_temperature)
    kept = sorted(sorted(range(len(search.tokens)), key=lambda node: (-search.values[node], node))
                  [: settings.total_tokens])
    position = {node: i for i, node in enumerate(kept)}
    parents = [position[search.parents[node]] if search.parents[node] >= 0 else -1 for node in kept]
    tokens = [search.tokens[node] for node in kept]
    return Draft(torch.tensor(tokens, dtype=torch.long, device=device), None,
                 torch.tensor(parents, dtype=torch.long, device=device)), kept


def grow_sampled_tree(root_logits: torch.Tensor, expand: Expand, settings: DynamicTree, k: int,
                      sampling: Sampling, generator: torch.Generator, prefix_q: PrefixQ | None = None
                      ) -> tuple[Draft, list[int]]:
    """A tree of sampled siblings for temperature > 0 (SpecInfer's multi-step speculative
    sampling, Miao et al. 2024, §4.3): each node's children are draws from the drafter's
    processed distribution q there, reported as the draft's probs, i.i.d. or without replacement
    as `settings.siblings` says (`draw_siblings`; the draft declares it). `SampledGrowth` grows it,
    a depth at a time; `expand(search, nodes)` runs each depth's chosen nodes."""
    growth = SampledGrowth(root_logits, settings, k, sampling, generator, prefix_q)
    while (nodes := growth.next()) is not None:
        growth.take(expand(growth.search, nodes))
    return growth.draft(root_logits.device), list(range(len(growth.search.tokens)))


class SampledGrowth:
    """One row's tree of sampled siblings, grown a depth at a time (`grow_sampled_tree`; a batch of
    rows grows in lockstep, one forward per depth for every row).

    Nothing drawn is ever dropped (pruning a sibling for its token would bias the rest). The
    shape is decided before each draw: the node budget `total_tokens` is split evenly over the
    min(depth, k) levels; at depth 1 the root gets that many draws (at most top_k), and at each
    further depth the most valuable nodes of the depth before (at most top_k of them) share the
    level's budget. Values (path probabilities at `value_temperature`) only choose which nodes
    to expand, which may depend on anything drawn before. With `prefix_q` (settings that read
    the prefix) each expanded node's q is processed from its own path.
    """

    def __init__(self, root_logits: torch.Tensor, settings: DynamicTree, k: int, sampling: Sampling,
                 generator: torch.Generator, prefix_q: PrefixQ | None = None) -> None:
        self.settings, self.sampling, self.generator, self.prefix_q = settings, sampling, generator, prefix_q
        self.depth = min(k, settings.depth) if settings.depth is not None else k
        self.search = TreeSearch([], [], [], [])
        self.level = 0
        self.newest: list[int] = []
        self.parents: list[int] = []
        if self.depth >= 1:
            self._draw(root_logits[None], [-1])

    def next(self) -> list[int] | None:
        """The nodes to run next (all of one depth, in creation order), or None when the tree is done."""
        if self.level >= self.depth or not self.newest:
            return None
        budget = self._budget()
        chosen = sorted(self.newest, key=lambda node: (-self.search.values[node], node))[: min(self.settings.top_k,
                                                                                                 budget)]
        self.parents = sorted(chosen)  # creation order: the caller sees them as made
        return self.parents if self.parents else None

    def take(self, logits: torch.Tensor) -> None:
        """Draw the children of the nodes `next` gave, from their logits [len(nodes), V]."""
        self._draw(logits, self.parents)

    def draft(self, device: torch.device) -> Draft:
        """The tree drawn so far, nodes in creation order, each with the q it was drawn from."""
        search = self.search
        if not search.tokens:  # nothing drawn (a depth below 1): an empty chain
            return Draft(torch.empty(0, dtype=torch.long, device=device))
        probs = torch.stack(search.rows) if search.rows else None  # (n, V)
        return Draft(torch.tensor(search.tokens, dtype=torch.long, device=device), probs,
                     torch.tensor(search.parents, dtype=torch.long, device=device), siblings=self.settings.siblings)

    def _budget(self) -> int:
        return (self.settings.total_tokens - len(self.search.tokens)) // (self.depth - self.level)

    def _draw(self, logits: torch.Tensor, parents: list[int]) -> None:
        budget = self._budget()
        counts = [min(self.settings.top_k, budget // len(parents) + (i < budget % len(parents)))
                  for i in range(len(parents))]
        self.newest = _draw_children(self.search, logits, parents, counts, self.sampling, self.generator,
                                     self.settings, self.prefix_q)
        self.level += 1


def grow(root_logits: torch.Tensor, expand: Expand, settings: DynamicTree, k: int, sampling: Sampling,
         generator: torch.Generator, sampled: bool, prefix_q: PrefixQ | None = None) -> tuple[Draft, list[int]]:
    """The drafter's tree for this step: sampled siblings when `sampled` and the sampling is not
    greedy, else the EAGLE-2 tree of top-k candidates (deterministic: exact whatever q)."""
    if sampled and not sampling.greedy:
        return grow_sampled_tree(root_logits, expand, settings, k, sampling, generator, prefix_q)
    return grow_tree(root_logits, expand, settings, k, root_logits.device)


def prefix_q(ctx: DraftContext) -> PrefixQ | None:
    """The q of a sampled tree's expanded nodes, each from its own path, when the settings read
    the prefix (`ctx.probabilities`); None otherwise (every row processed alike)."""
    return ctx.probabilities if ctx.sampling.reads_prefix else None


def _path(search: TreeSearch, node: int) -> list[int]:
    """The tokens from the root to `node` (-1: the root, no token), root side first."""
    path: list[int] = []
    while node >= 0:
        path.append(search.tokens[node])
        node = search.parents[node]
    return path[::-1]


def draw_siblings(q: torch.Tensor, count: int, siblings: str, generator: torch.Generator) -> list[int]:
    """`count` children of one node from q [V], in draw order: i.i.d. draws ("iid"), or successive
    draws without replacement ("without_replacement"), at most as many as q has tokens. Without
    replacement is Gumbel-top-k: the tokens of the `count` largest log q(x) + Gumbel noise, in
    decreasing order, are distributed as draws without replacement in that order (Kool, van Hoof
    and Welling 2019, "Stochastic Beams and Where to Find Them")."""
    if siblings == "iid":
        return torch.multinomial(q, count, replacement=True, generator=generator).tolist()
    count = min(count, int((q > 0).sum()))
    uniforms = torch.rand(q.shape, generator=generator, dtype=torch.float64, device=q.device)  # (V,)
    scores = q.double().log() - (-uniforms.log()).log()  # (V,) log q + Gumbel(0, 1); -inf where q = 0
    return scores.topk(count).indices.tolist()


def _draw_children(search: TreeSearch, logits: torch.Tensor, parents: list[int], counts: list[int],
                   sampling: Sampling, generator: torch.Generator, settings: DynamicTree,
                   prefix_q: PrefixQ | None = None) -> list[int]:
    """Draw counts[i] children of parents[i] from the processed rows of logits [f, V]
    (`draw_siblings`, as `settings.siblings` says)."""
    if prefix_q is not None:
        q = prefix_q(logits, [_path(search, parent) for parent in parents])  # (f, V)
    else:
        q = probabilities(logits, sampling)  # (f, V)
    log_values = torch.log_softmax(logits.float() / settings.value_temperature, dim=-1)  # (f, V)
    made: list[int] = []
    for i, (parent, count) in enumerate(zip(parents, counts)):
        if count <= 0:
            continue
        drawn = draw_siblings(q[i], count, settings.siblings, generator)
        base = search.values[parent] if parent >= 0 else 0.0
        depth = search.depths[parent] + 1 if parent >= 0 else 1
        for token, value in zip(drawn, log_values[i, drawn].tolist()):
            made.append(len(search.tokens))
            search.tokens.append(token)
            search.parents.append(parent)
            search.depths.append(depth)
            search.values.append(base + value)
            search.rows.append(q[i])
    return made


class TreeColumns:
    """Where the expanded nodes sit in a drafter's own cache, after `real` committed entries.

    `visible` gives the attention mask of one depth's forward: each node sees the committed
    entries, its ancestors' entries and itself, as in the target's tree forward. With `rows`,
    each forward is padded to that many rows (a fixed shape): a pad row sees only itself and
    its entry is rolled back after the forward, so the next depth's nodes follow the real ones.
    `width(rows)` gives the mask's columns: a static cache's capacity, or the entries so far
    plus the forward's rows.
    """

    def __init__(self, real: int, width: Callable[[int], int] | None = None, rows: int | None = None) -> None:
        self.real = real
        self.length = real
        self.rows = rows
        self._width = width
        self.column: dict[int, int] = {}  # search node id -> cache position

    def padded(self, count: int) -> int:
        """Rows of the forward that runs `count` nodes."""
        return max(count, self.rows or 0)

    def visible(self, search: TreeSearch, nodes: list[int], device: torch.device) -> torch.Tensor:
        """Bool [padded(len(nodes)), width] for running `nodes` next; records their columns."""
        rows = self.padded(len(nodes))
        width = self._width(rows) if self._width is not None else self.length + rows
        mask = torch.zeros(rows, width, dtype=torch.bool)
        mask[: len(nodes), : self.real] = True
        for i, node in enumerate(nodes):
            ancestor = search.parents[node]
            while ancestor >= 0:
                mask[i, self.column[ancestor]] = True
                ancestor = search.parents[ancestor]
        mask[torch.arange(rows), self.length + torch.arange(rows)] = True  # every row sees itself
        for i, node in enumerate(nodes):
            self.column[node] = self.length + i
        self.length += len(nodes)
        return mask.to(device)
