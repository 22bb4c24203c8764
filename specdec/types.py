"""Frozen value types shared by the loop, the verifier and the drafters, and `Engine`, how a run
runs its models as drafters see it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["CAPACITY_STEP", "UNDECLARED_NODES", "BatchGenerations", "Draft", "Engine", "ExtraRows", "Generation",
           "Sampling", "Stats", "Verdict", "static_capacity", "total_stats"]

CAPACITY_STEP = 256  # static caches are sized in multiples of this, so nearby lengths share compiled graphs


@dataclass(frozen=True)
class Sampling:
    """How logits become a next-token distribution: the settings users know from transformers and
    the OpenAI API, applied in one stated order (`specdec.processing`, whose docstring is the
    reference) to the target's p at every verify position and to a drafter's q alike.

    temperature: 0 means greedy (the argmax of the processed logits); otherwise logits are divided by it.
    top_k: keep the k most likely tokens (ties at the cut kept); 0 disables.
    top_p: keep the smallest set whose probability reaches top_p; 1.0 disables.
    min_p: drop tokens less likely than min_p times the most likely one (after temperature,
        transformers' MinPLogitsWarper); 0 disables.
    repetition_penalty: transformers' rule over every id of the prefix, prompt included: a
        logit l of such an id becomes l / penalty when l > 0, l * penalty otherwise; 1.0 disables.
    presence_penalty, frequency_penalty: the OpenAI rule over the generated ids only: a logit
        drops by frequency_penalty * count + presence_penalty * (count > 0); 0 disables.
    logit_bias: {token id: bias} added to the logits (-inf bans the id).
    bad_words_ids: id sequences never generated (transformers' NoBadWordsLogitsProcessor: the
        last id of a sequence is banned when the prefix ends with the rest of it).
    no_repeat_ngram_size: no n-gram of this size occurs twice (transformers'
        NoRepeatNGramLogitsProcessor); 0 disables.
    logits_processors: transformers `LogitsProcessor`s (any callable (input_ids [1, L], scores
        [1, V]) -> scores [1, V]), called as transformers calls them, one verify position at a
        time with that position's whole prefix.
    json_schema, regex, grammar: constrain the output to a JSON schema (a dict or its JSON
        text), a regular expression, or an EBNF grammar (at most one; needs the target's
        tokenizer, `specdec.generate(..., tokenizer=)`).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] | tuple[tuple[int, float], ...] = ()
    bad_words_ids: Sequence[Sequence[int]] = ()
    no_repeat_ngram_size: int = 0
    logits_processors: Sequence[Any] = ()
    json_schema: str | Mapping[str, Any] | None = None
    regex: str | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(
                f"Sampling.temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}"
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"Sampling.top_k must be an int >= 0 (0 disables it), got {self.top_k!r}")
        if not _number(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"Sampling.top_p must lie in (0, 1] (1 disables it), got {self.top_p!r}")
        if not _number(self.min_p) or not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"Sampling.min_p must lie in [0, 1] (0 disables it), got {self.min_p!r}")
        if not _number(self.repetition_penalty) or not (0.0 < self.repetition_penalty < math.inf):
            raise ValueError("Sampling.repetition_penalty must be a finite number > 0 (1 disables it; above 1 "
                             f"discourages repeats), got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _number(value) or not math.isfinite(value):
                raise ValueError(f"Sampling.{name} must be a finite number (0 disables it), got {value!r}")
        if isinstance(self.no_repeat_ngram_size, bool) or not isinstance(self.no_repeat_ngram_size, int) \
                or self.no_repeat_ngram_size < 0:
            raise ValueError("Sampling.no_repeat_ngram_size must be an int >= 0 (0 disables it), "
                             f"got {self.no_repeat_ngram_size!r}")
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        object.__setattr__(self, "bad_words_ids", _bad_words(self.bad_words_ids))
        object.__setattr__(self, "logits_processors", _processors(self.logits_processors))
        object.__setattr__(self, "json_schema", _schema(self.json_schema))
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"Sampling.{name} must be a non-empty string or None, got {value!r}")
        given = [name for name in ("json_schema", "regex", "grammar") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"Sampling takes at most one constraint, got {' and '.join(given)}: combine them into "
                             "one grammar")

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax (temperature 0)."""
        return self.temperature == 0.0

    @property
    def constraint(self) -> tuple[str, str] | None:
        """("json_schema" | "regex" | "grammar", its text), or None when the output is unconstrained."""
        for name in ("json_schema", "regex", "grammar"):
            value = getattr(self, name)
            if value is not None:
                return name, value
        return None

    @property
    def counts_prefix(self) -> bool:
        """A setting reads how often each id occurs in the prefix (the penalties)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def walks_prefix(self) -> bool:
        """A setting reads the prefix's order on the host, one verify position at a time: a bad
        word of several ids, no_repeat_ngram_size, a logits processor, a constraint."""
        return (any(len(words) > 1 for words in self.bad_words_ids) or self.no_repeat_ngram_size > 0
                or bool(self.logits_processors) or self.constraint is not None)

    @property
    def reads_prefix(self) -> bool:
        """p depends on the prefix, so each verify position (tree node, batch row) gets its own."""
        return self.counts_prefix or self.walks_prefix

    @property
    def plain(self) -> bool:
        """Only temperature, top-k and top-p: the settings a compiled step applies by itself."""
        return not self.reads_prefix and self.min_p == 0.0 and not self.logit_bias and not self.bad_words_ids


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """{id: bias} or ((id, bias), ...) as ((id, bias), ...) sorted by id."""
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = [(token, bias) for token, bias in items]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(f"Sampling.logit_bias must map token ids to biases ({{id: bias}}), got {value!r}") from None
    for token, bias in pairs:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"Sampling.logit_bias keys must be token ids (ints >= 0), got {token!r}")
        if not _number(bias) or math.isnan(bias) or bias == math.inf:
            raise ValueError(f"Sampling.logit_bias[{token}] must be a finite number or -inf (a ban), got {bias!r}")
    if len({token for token, _ in pairs}) != len(pairs):
        raise ValueError(f"Sampling.logit_bias names a token id twice: {value!r}")
    return tuple(sorted((token, float(bias)) for token, bias in pairs))


def _bad_words(value: object) -> tuple[tuple[int, ...], ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"Sampling.bad_words_ids must be a list of id lists, got {value!r}")
    words = []
    for word in value:
        if isinstance(word, (str, bytes)) or not isinstance(word, Sequence) or not word or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in word):
            raise ValueError(f"Sampling.bad_words_ids must hold non-empty lists of token ids (ints >= 0), "
                             f"got {word!r}")
        words.append(tuple(word))
    return tuple(words)


def _processors(value: object) -> tuple[Any, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):  # a LogitsProcessorList is a list
        raise ValueError("Sampling.logits_processors must be a list of transformers LogitsProcessors (callables "
                         f"(input_ids, scores) -> scores), got {value!r}")
    for processor in value:
        if not callable(processor):
            raise ValueError(f"Sampling.logits_processors holds {processor!r}, which is not callable: give "
                             "transformers LogitsProcessors or callables (input_ids, scores) -> scores")
    return tuple(value)


def _schema(value: object) -> str | None:
    """A JSON schema as compact JSON text, its keys in the order given (a grammar engine emits an
    object's properties in the schema's order, so the order is part of the schema)."""
    import json

    if value is None:
        return None
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
        if not isinstance(parsed, Mapping) and not isinstance(parsed, bool):
            raise ValueError
        return json.dumps(parsed, separators=(",", ":"))
    except (TypeError, ValueError):
        raise ValueError(f"Sampling.json_schema must be a JSON schema (a dict, or its JSON text), got "
                         f"{str(value)[:200]!r}") from None


@dataclass(frozen=True)
class ExtraRows:
    """Rows a drafter rides along in the verify forward: the target runs them, the drafter reads
    their logits back (`DraftContext.extra_logits`), nothing of them is ever committed.

    tokens: LongTensor [m], the rows' ids.
    positions: LongTensor [m], each row's position as an offset >= 1 after the last committed
        token (the root, offset 0).
    visible: BoolTensor [m, m]; visible[i, j]: row i attends to row j. Every row also sees the
        cached prefix, the root and itself; it sees no draft node and no draft node sees it.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    visible: torch.Tensor

    def padded(self, rows: int) -> ExtraRows:
        """These rows then pad rows up to `rows` (id 0 at offset 1, seeing only the prefix, the
        root and themselves), so every verify forward keeps one shape."""
        m = self.tokens.shape[0]
        if rows <= m:
            return self
        visible = torch.zeros(rows, rows, dtype=torch.bool, device=self.visible.device)
        visible[:m, :m] = self.visible
        return ExtraRows(torch.cat([self.tokens, self.tokens.new_zeros(rows - m)]),
                         torch.cat([self.positions, self.positions.new_ones(rows - m)]), visible)


@dataclass(frozen=True)
class Draft:
    """Proposed tokens: a chain, or a tree of candidates verified in one target forward.

    tokens: LongTensor [n]. For a chain n <= k; for a tree the nodes in topological order
            (every parent before its children) and the depth at most k.
    probs:  FloatTensor [n, V], row i the processed distribution node i was drawn from, given
            its ancestors; None for deterministic candidates (each treated as a one-hot q).
            How siblings were drawn is declared by `siblings`.
    parents: LongTensor [n] or None. parents[i] is the index of node i's parent, or -1 when
            it continues the last committed token; None means a chain (parents = i - 1).
    siblings: how a tree's siblings were drawn (`specdec.verifier.siblings`): "iid" (each an
            independent draw from its row, duplicates allowed), "without_replacement" (successive
            draws without replacement from one shared row, in draft order) or "distinct"
            (deterministic candidates, no probs). None: "iid" with probs, "distinct" without.
            The verifier tests each sibling against the q it was drawn from given its elders.
    extra: rows to run in the same target forward for the drafter's own use (`ExtraRows`,
            e.g. lookahead decoding's Jacobi rows), or None. They never touch the verdict; a
            draft that carries them is verified as a tree (a chain as a chain-shaped tree).
    forwards: how many forwards of the drafter made this draft, where it says (a block drafter:
            1 whatever the draft's length); None when it does not. Traces show it.
    note:   why the drafter drafted what it did, where it says (`num_draft_tokens="auto"`'s
            decision to draft or not, `specdec.decoding.auto_draft`); traces and `specdec play`
            show it.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    parents: torch.Tensor | None = None
    extra: ExtraRows | None = None
    siblings: str | None = None
    forwards: int | None = None
    note: str | None = None

    @property
    def is_tree(self) -> bool:
        """Whether the draft carries parent indices (a chain given as a tree counts)."""
        return self.parents is not None


@dataclass(frozen=True)
class Verdict:
    """What one verification emitted.

    tokens: LongTensor [num_accepted + 1]: the accepted draft tokens, then the correction
            (after a rejection) or the bonus token (after a full acceptance).
    num_accepted: how many draft tokens were accepted.
    acceptance: [k] min(1, p/q) of each draft token (greedy: 1.0 where it equals the argmax,
        else 0.0, up to the first mismatch); None if not computed.
    uniforms: [k] the uniform draws compared with `acceptance` (None when nothing was drawn).
        For a tree both follow the accepted path: one entry per node tried along it.
    path: the accepted nodes' indices in the draft, root side first (a chain's are
        0..num_accepted-1).
    tested: the draft node each `acceptance` entry tested, in draw order, for a rule that tests
        nodes off the accepted path (traversal verification: leaves before their parents);
        None when the entries follow the accepted path as above.
    """

    tokens: torch.Tensor
    num_accepted: int
    acceptance: torch.Tensor | None = None
    uniforms: torch.Tensor | None = None
    path: tuple[int, ...] | None = None
    tested: tuple[int, ...] | None = None

    @property
    def accepted_nodes(self) -> tuple[int, ...]:
        """Indices of the accepted draft nodes, in order."""
        return self.path if self.path is not None else tuple(range(self.num_accepted))


@dataclass(frozen=True)
class Stats:
    """Counters of one generation.

    steps: target forwards after the prefill (each emits 1..k+1 tokens).
    new_tokens: tokens emitted (the EOS included when it ended the run).
    drafted / accepted: draft tokens proposed / accepted by the verifier (a token accepted
        after an EOS in the same block counts as accepted, though it is not emitted).
    accepted_per_position[i] / drafted_per_position[i]: acceptance at draft position i.
    accepted_per_step[s]: the draft tokens verify step s accepted (it emitted them and one more,
        unless an EOS ended the block), so the emitted tokens can be laid against the steps.
    prefill_seconds: the prompt's forward and the drafter's prefill.
    draft_seconds: the drafter's propose and commit; verify_seconds: the target forwards after
        the prefill, verification and bookkeeping; wall_seconds: the whole call.
    """

    steps: int = 0
    new_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_position: tuple[int, ...] = ()
    drafted_per_position: tuple[int, ...] = ()
    accepted_per_step: tuple[int, ...] = ()
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target forward, bonus included (vLLM / Spec-Bench convention)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0


def total_stats(runs: Sequence[Stats]) -> Stats:
    """The counters of several generations added up (per-position counts aligned from position 0,
    the per-step counts one run's after another's)."""
    width = max((len(r.drafted_per_position) for r in runs), default=0)

    def column(name: str) -> tuple[int, ...]:
        return tuple(sum(getattr(r, name)[i] for r in runs if i < len(getattr(r, name))) for i in range(width))

    return Stats(
        steps=sum(r.steps for r in runs), new_tokens=sum(r.new_tokens for r in runs),
        drafted=sum(r.drafted for r in runs), accepted=sum(r.accepted for r in runs),
        accepted_per_position=column("accepted_per_position"), drafted_per_position=column("drafted_per_position"),
        accepted_per_step=tuple(a for r in runs for a in r.accepted_per_step),
        prefill_seconds=sum(r.prefill_seconds for r in runs), draft_seconds=sum(r.draft_seconds for r in runs),
        verify_seconds=sum(r.verify_seconds for r in runs), wall_seconds=sum(r.wall_seconds for r in runs))


@dataclass(frozen=True)
class Generation:
    """The result of `specdec.generate`: the new tokens only, and the run's counters."""

    tokens: list[int] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)


class BatchGenerations(list[Generation]):
    """The result of `specdec.generate_batch`: one Generation per prompt, in order, each with its
    row's own counters (its steps are the batched forwards it took part in, its verify seconds
    theirs, its wall seconds until it finished), and `totals`, the batch's: its batched
    forwards, every row's tokens and drafts, and the seconds of the whole call."""

    def __init__(self, generations: Sequence[Generation], totals: Stats) -> None:
        super().__init__(generations)
        self.totals = totals


UNDECLARED_NODES = 64  # the tree budget of a drafter without max_draft_nodes


@dataclass(frozen=True)
class Engine:
    """How one generate call runs its models, as drafters see it (`DraftContext.engine`).

    compile: whether fixed-shape steps are compiled (`specdec.generate(..., compile=True)`).
    max_length: the most committed tokens: the prompt plus max_new_tokens.
    max_draft: the loop's k, the longest chain (a tree's greatest depth) a drafter may propose.
    draft_nodes: the most nodes a draft may hold: the drafter's `max_draft_nodes(k)`, or
        UNDECLARED_NODES for a drafter that declares none.
    declared: whether draft_nodes was declared; a declared budget pads every tree to it (one
        shape), an undeclared one to the next power of two (a few shapes).
    extra_rows: the most rows a draft's `extra` holds (the drafter's `extra_rows()`, else 0);
        a verify forward with extra rows pads them to this many, after the tree's rows.
    chain_widths: the row counts a chain's verify forward pads to on a static cache, ascending
        (`chain_rows`); empty: max_draft + 1 alone, one graph for every draft. `num_draft_tokens=
        "auto"` adds 2, so that a one-token draft costs a two-row forward.
    """

    compile: bool = False
    max_length: int = 0
    max_draft: int = 0
    draft_nodes: int = 0
    declared: bool = True
    extra_rows: int = 0
    chain_widths: tuple[int, ...] = ()

    def chain_rows(self, drafted: int, hidden: bool = False) -> int:
        """Rows of the verify forward of a chain of `drafted` tokens on a static cache: the last
        committed token and the draft, padded to the narrowest of `chain_widths` that holds them.
        No draft takes one row, unless the drafter reads hidden states (`hidden`): then the narrowest
        width (k + 1, or 2 under "auto"), so that it needs no graph of its own."""
        if drafted == 0 and not hidden:
            return 1
        widths = self.chain_widths or (self.max_draft + 1,)
        return next((width for width in widths if width > drafted), max(widths[-1], drafted + 1))

    def tree_rows(self, nodes: int) -> int:
        """Rows of the verify forward of a tree of `nodes` nodes (the root's row included)."""
        if self.declared:
            return self.draft_nodes + 1
        return min(max(8, 1 << nodes.bit_length()), self.draft_nodes + 1)

    @property
    def verify_rows(self) -> int:
        """Rows of the widest verify forward: the last committed token, the largest draft and
        the extra rows."""
        return max(self.max_draft, self.draft_nodes) + 1 + self.extra_rows

    def capacity(self, extra: int = 0) -> int:
        """Positions of a static cache that holds the whole generation, the widest verify and
        `extra` more (a drafter's own draft rows), rounded up so nearby lengths share graphs."""
        return static_capacity(self.max_length + self.verify_rows + extra)


    def cache_capacity(self, extra: int = 0, static: bool = False) -> int | None:
        """The positions of a model's static cache in this generation (`capacity`), or None for a
        dynamic one. Compiled decoding takes static caches: their fixed shapes are what graphs
        replay. Eager decoding takes transformers' dynamic cache for a model of full-attention
        layers, since on a static one every eager forward would attend over all its columns and
        run padding rows; a model that needs the static cache eagerly too (`static`: linear
        attention, sliding windows; `CausalLM.static_eagerly`) keeps it."""
        if not self.max_length or not (self.compile or static):
            return None
        return self.capacity(extra)


def static_capacity(positions: int) -> int:
    """The size of a static cache holding `positions`: rounded up to a multiple of CAPACITY_STEP."""
    return max(1, -(-positions // CAPACITY_STEP)) * CAPACITY_STEP
