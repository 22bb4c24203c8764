"""The Drafter protocol: the one extension contract (a drafter drafts for the rows it is given, a
batch of one included, and declares what else it does), and the context a drafter receives for a row."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch

from specdec.types import Draft, Engine, Sampling

if TYPE_CHECKING:
    from specdec.processing import Pipeline, Prefixes
    from specdec.runtime.target import CausalLM

__all__ = ["Capability", "DraftContext", "Drafter", "RowDrafter", "RowView", "Rows", "row_view", "check_declarations", "declares", "forget",
           "is_rows_drafter"]


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may read at one decode step; nothing in it belongs to the drafter.

    tokens: LongTensor [T] of committed ids (prompt and accepted output) on the target's
        device. The target's KV cache holds all of them but the last.
    sampling: the settings the verifier applies to p; a sampled draft must use them for q.
    generator: the step's random source; draw every random number from it (reproducibility).
    target: the target adapter (embedding, LM head, final norm, config, device).
    vocab_size: V, the width of p and of any q.
    hidden_states: FloatTensor [n, m * H], the target's hidden states of the layers the drafter
        names (`Capability.HIDDEN_STATES`), concatenated, for the n positions the target processed
        since the previous step, i.e. tokens[-n-1:-1]; None for a drafter that reads none. The
        same value is passed to `commit` and to the next `propose`.
    accepted: the indices, in the previous draft, of its nodes that were just committed, root
        side first (for a chain 0..num_accepted-1); a tree drafter reads its path here.
    engine: how this generation runs its models: whether fixed-shape steps are compiled, the
        longest the committed sequence gets and the loop's k (`specdec.types.Engine`), for a
        drafter that keeps a static cache (`engine.capacity(...)`) or compiles its own step.
    extra_logits: FloatTensor [m, V], the target's raw logits (before any sampling) at the m
        extra rows of the draft just verified (`Draft.extra`), in its order, padding left
        out; None when that draft carried none or the target could not run them. The same
        value is passed to `commit` and to the next `propose`.
    budget: how many tokens this sequence may still emit, this step's included (None when the
        caller does not say); a drafter asked for fewer than the loop's k tokens tells from it
        whether the budget's end cut the draft short.
    pipeline: the generation's sampling pipeline (`specdec.processing.Pipeline`); a drafter
        reaches it through `probabilities` and `greedy_ids`.
    tokenizer: the target's tokenizer when the caller gave one (`specdec.generate(tokenizer=)`),
        else None; a drafter that works on text (a draft model with a vocabulary of its own)
        reads it here.
    target_rows: the target as the loop drives it (`specdec.runtime.rows`: `OneRow` for one
        prompt, `BatchLM` for several), and `slot` this row's slot in it: for a drafter that
        drafts over the target's own cache (self-speculation), nothing else.
    """

    tokens: torch.Tensor
    sampling: Sampling
    generator: torch.Generator
    target: CausalLM
    vocab_size: int
    hidden_states: torch.Tensor | None = None
    accepted: tuple[int, ...] = ()
    engine: Engine = Engine()
    extra_logits: torch.Tensor | None = None
    budget: int | None = None
    pipeline: Pipeline | None = None
    tokenizer: Any = None
    target_rows: Any = None
    slot: int = 0

    def probabilities(self, logits: torch.Tensor, drafted: Sequence[Sequence[int] | torch.Tensor] | None = None
                      ) -> torch.Tensor:
        """q by the pipeline the verifier applies to p: logits [m, V] -> distributions [m, V], row i
        processed as if `drafted[i]` (the draft ids on its path, root side first) followed the
        committed ids (None: every row follows the committed ids alone). One-hot at the processed
        argmax when greedy. A sampled draft token must be drawn from its row. A row the settings
        leave no id (a grammar that allows none of a smaller draft vocabulary's ids) is its raw
        logits, warped: its draws are rejected, and the verifier stays exact."""
        return self._pipeline().probabilities(logits, self._prefixes(logits, drafted), draft=True)

    def greedy_ids(self, logits: torch.Tensor, drafted: Sequence[Sequence[int] | torch.Tensor] | None = None
                   ) -> torch.Tensor:
        """The argmax of each row's processed scores [m], rows as for `probabilities`."""
        return self._pipeline().argmax(logits, self._prefixes(logits, drafted), draft=True)

    def _pipeline(self) -> Pipeline:
        if self.pipeline is None:
            from specdec.processing import Pipeline

            object.__setattr__(self, "pipeline", Pipeline(self.sampling, self.vocab_size, 0))
        assert self.pipeline is not None
        return self.pipeline

    def _prefixes(self, logits: torch.Tensor, drafted: Sequence[Sequence[int] | torch.Tensor] | None) -> Prefixes | None:
        if not self.sampling.reads_prefix:
            return None
        from specdec.processing import Prefixes

        rows = logits.shape[0]
        if drafted is not None and len(drafted) != rows:
            raise ValueError(f"ctx.probabilities: {rows} logits rows but {len(drafted)} drafted prefixes")
        return Prefixes.of(self.tokens, self._pipeline().prompt_length, drafted if drafted is not None else [[]] * rows)


Rows = Mapping[int, DraftContext]
"""The rows a drafter is asked about: each row's index in the prompt list -> its context. A call
names only the rows still decoding; a batch of one is {0: ctx}."""


class Capability(enum.Enum):
    """What a drafter does beyond `propose`, each with the methods it brings. A drafter declares
    the set it has (`Drafter.capabilities`); the loop calls a capability's methods only when it
    is declared, and `check_declarations` names a declared method that is missing."""

    STATE = "state"
    """Own state that follows the committed sequence: `prefill(rows)` once per generation, after
    the target's prefill (reset and fill own caches); `commit(rows, accepted)` after each verify,
    for the rows that drafted (`accepted[row]` of the last draft's tokens are now committed,
    `ctx.accepted` names a tree's nodes; roll back own state)."""

    LEARNS = "learns"
    """Learns from finished generations: `finish(rows)` when rows end (their ctx holds the final
    tokens), and `forget()` drops what was learned, as a fresh instance (benchmarks call it before
    each round, so no round drafts from an earlier round's answers)."""

    HIDDEN_STATES = "hidden_states"
    """Reads the target's hidden states: `hidden_layers(target) -> tuple[int, ...]`, called once per
    generation before the target's prefill, names the layers (transformers' `hidden_states`
    indices: 0 the embeddings, i the residual stream entering layer i, target.num_layers the
    post-norm last layer). `ctx.hidden_states` then holds them, concatenated, for the positions
    the target processed since the previous step."""

    TREES = "trees"
    """Drafts token trees: `max_draft_nodes(k) -> int`, the most nodes a draft of depth at most k
    holds; the target's cache is sized for it and every tree is padded to it (one shape). A
    drafter that drafts trees without declaring them may hold at most
    `specdec.types.UNDECLARED_NODES` nodes, padded to the next power of two."""

    EXTRA_ROWS = "extra_rows"
    """Rides rows of its own in the verify forward (`Draft.extra`, lookahead's Jacobi rows):
    `extra_rows() -> int`, the most such rows a draft holds; every such forward pads them to this
    many. Their logits come back in `ctx.extra_logits`; they never enter the cache or the verdict.
    Targets that cannot run them drop them, with a warning."""

    CACHE_LENGTH = "cache_length"
    """Reports its own cache: `cache_length(row) -> int`, the positions the drafter's cache holds
    for that row; traces record it before and after each propose and commit."""


_METHODS: dict[Capability, tuple[str, ...]] = {
    Capability.STATE: ("prefill", "commit"), Capability.LEARNS: ("finish", "forget"),
    Capability.HIDDEN_STATES: ("hidden_layers",), Capability.TREES: ("max_draft_nodes",),
    Capability.EXTRA_ROWS: ("extra_rows",), Capability.CACHE_LENGTH: ("cache_length",),
}


@runtime_checkable
class Drafter(Protocol):
    """Proposes, for every row it is given, up to k[row] tokens continuing that row's `ctx.tokens`.

    Required: a class attribute `name` (the registry name), `capabilities` (the `Capability` set
    it declares; empty for a drafter that keeps no state and reads nothing but the context) and
    `propose`. Each declared capability brings its methods (`Capability`).

    Each row is a generation of its own: its committed ids, its generator, its hidden states. A
    drafter keeps per-row state keyed by the row index, or drafts every row in one forward (the
    learned drafters do). A draft with `parents` is a tree whose depth is at most k[row] and whose
    size is at most max_draft_nodes(k) (`specdec.types.Draft`); targets that cannot run a tree
    forward verify its first-child path instead, with a warning. A draft with `probs` promises
    its tokens were drawn from exactly those rows, after the same sampling pipeline
    (`ctx.probabilities(logits, drafted)`: each row from its own draft prefix, as the verifier
    processes p). Every draft is checked; a broken one raises a `specdec.verifier.DraftError`
    naming the drafter and the row, and an exception raised in any method reaches the caller as
    a DraftError naming the drafter and the method, the original chained.

    A drafter of the earlier, one-row protocol (`RowDrafter`: `propose(ctx, k) -> Draft`, no
    `capabilities`) is served through an adapter (`specdec.decoding.row_drafters`): one instance
    per row.
    """

    name: ClassVar[str]
    capabilities: ClassVar[frozenset[Capability]]

    def propose(self, rows: Rows, k: Mapping[int, int]) -> Mapping[int, Draft]:
        """Return each row's Draft of at most k[row] tokens (every row of `rows`)."""
        ...


@runtime_checkable
class RowDrafter(Protocol):
    """The earlier, one-row protocol, kept for plugins written against it: `propose(ctx, k) -> Draft`
    for one row, and optional methods found by name: `prefill(ctx)`, `commit(ctx, num_accepted)`,
    `finish(ctx)`, `forget()`, `fork()` (another instance for another row of a batch; without it
    the adapter deep-copies the drafter, sharing its torch modules), `max_draft_nodes(k)`,
    `extra_rows()`, `hidden_layers(target)` or `uses_hidden_states = True` (the last layer), and
    an int attribute `cache_length`. New drafters implement `Drafter`."""

    name: ClassVar[str]

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        ...


def declares(drafter: object, capability: Capability) -> bool:
    """Whether `drafter` declares `capability`."""
    return capability in getattr(drafter, "capabilities", ())


def is_rows_drafter(drafter: object) -> bool:
    """Whether `drafter` follows `Drafter` (its class declares its capabilities), not the earlier protocol
    (a wrapper that forwards attributes to a `Drafter` it holds is not one)."""
    return isinstance(getattr(type(drafter), "capabilities", None), frozenset)


def check_declarations(drafter: object, name: str) -> None:
    """Raise naming the drafter when a capability it declares lacks one of its methods, or when
    it declares something that is no Capability."""
    declared = getattr(drafter, "capabilities")
    for capability in declared:
        if not isinstance(capability, Capability):
            raise TypeError(f"drafter {name!r} declares {capability!r}, which is no specdec.Capability "
                            f"(one of {', '.join(c.name for c in Capability)})")
        for method in _METHODS[capability]:
            if not callable(getattr(drafter, method, None)):
                raise TypeError(f"drafter {name!r} declares Capability.{capability.name} but has no "
                                f"{method}() method; define it or drop the capability")


def forget(drafter: object) -> None:
    """Have a drafter that learns across generations (`Capability.LEARNS`) start the round as a fresh
    instance would; a drafter of the earlier protocol when it has a `forget()`."""
    if declares(drafter, Capability.LEARNS):
        drafter.forget()  # type: ignore[attr-defined]
    elif not is_rows_drafter(drafter) and callable(getattr(drafter, "forget", None)):
        drafter.forget()  # type: ignore[attr-defined]


class RowView:
    """A `Drafter` seen as a one-row drafter (`RowDrafter`): each call is the drafter's call for row 0,
    and its declarations read as the earlier protocol's (`uses_hidden_states`, `max_draft_nodes`,
    ...). For code that drives a drafter one context at a time (wrappers, tests, a probe)."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.name = drafter.name

    @property
    def uses_hidden_states(self) -> bool:
        return declares(self.drafter, Capability.HIDDEN_STATES)

    @property
    def cache_length(self) -> int | None:
        if not declares(self.drafter, Capability.CACHE_LENGTH):
            return None
        return self.drafter.cache_length(0)  # type: ignore[attr-defined]

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        return self.drafter.propose({0: ctx}, {0: k})[0]

    def prefill(self, ctx: DraftContext) -> None:
        if declares(self.drafter, Capability.STATE):
            self.drafter.prefill({0: ctx})  # type: ignore[attr-defined]

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        if declares(self.drafter, Capability.STATE):
            self.drafter.commit({0: ctx}, {0: num_accepted})  # type: ignore[attr-defined]

    def finish(self, ctx: DraftContext) -> None:
        if declares(self.drafter, Capability.LEARNS):
            self.drafter.finish({0: ctx})  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:  # hidden_layers, max_draft_nodes, extra_rows, forget, options
        if name in ("drafter", "capabilities"):  # a view of the one-row protocol declares nothing
            raise AttributeError(name)
        return getattr(self.drafter, name)


def row_view(drafter: Any) -> Any:
    """`RowView(drafter)` for a `Drafter`; a drafter of the earlier protocol as it is."""
    return RowView(drafter) if is_rows_drafter(drafter) else drafter
