"""`num_draft_tokens="auto"`: draft only when it pays, judged from the step times the loop
measures on the engine in use and each row's running acceptance.

Speculation pays when the tokens a step emits per second beat plain decoding's: a step of a
batch of B rows where row r drafts k_r tokens emits 1 + a_r tokens per row, a_r its accepted
ones, in T_spec(B) seconds (draft, verify and sampling together), against B tokens in
T_plain(B) for a plain step (Leviathan et al. 2023, §3.4, where the same trade sets the best k;
Chen et al. 2023's cost coefficient c is T_spec / T_plain here, measured rather than assumed).
With a row's per-token acceptance α_r (i.i.d. acceptance, as those papers model it) a draft of
k tokens keeps E[a] = α + α² + … + α^k of them (`expected_accepted`). Each step is one of three
kinds: plain; one token per row (`SHORT`, for a chain drafter: the engine verifies a one-token
chain in a 2-row forward, `Engine.chain_widths`, which near the bandwidth floor costs about a
plain step); or each row its own length from the adaptive schedule of
`specdec.decoding.adaptive` (`LONG`, verified in the k + 1-row forward). The loop takes the
drafting kind expected to emit the most tokens per second when it beats a plain step,

    Σ_r (1 + E_r[a]) / T_kind(B) > B / T_plain(B)                                   (`drafting_pays`)

and a plain step otherwise, per step and per batch size, down to no draft at all.

Estimates. α_r is a Beta(1, 1)-smoothed ratio of accepted tokens to accepted tokens plus
rejections, its counts decayed by `DECAY` each step so it follows the text (Medusa's and
EAGLE's acceptance moves with it). T_spec(B) and T_plain(B) are exponentially averaged wall
seconds of the steps of each kind at B rows (a drafting step where no row drafted anything
counts as a plain one, one where every row drafted one token as a short one); a step during
which anything compiled is left out. Exploration: before the times are known at a batch size,
the loop measures each kind (two drafting steps, a plain one, two of one token); while drafting
is off it probes one drafting step after `PROBE_FIRST` plain steps, the interval doubling up to
`PROBE_LAST` while the probes confirm it, so a drafter that starts to pay again is seen.

Memory. One `AutoDraft` keeps what it measured from one generation to the next (the bench and a
server reuse theirs): the step times, the probe interval reached, and the drafter's acceptance
pooled over every row and generation (decayed by `POOL_DECAY` per row and step), from which a
new row's α starts at the weight of `PRIOR_WEIGHT` observations. So a drafter that did not pay
on the last prompts starts the next one off, probed at the interval reached, rather than paying
for its exploration again on every prompt; one that paid starts drafting.

A row that does not draft asks its drafter for nothing when the drafter keeps no state; a
drafter that keeps state (a draft model's cache, EAGLE's features) drafts one token that is
thrown away, so that its commit sees a step like any other (a draft of which nothing was kept).
Each draft carries the decision in its `note` (traces and `specdec play` show it). Every
decision only sets draft lengths, so the output distribution stays exactly plain sampling's; at
temperature > 0 a seed fixes the output only for the same decisions, which follow measured
times (greedy decoding is the same tokens whatever they are).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specdec.decoding.adaptive import AdaptiveDraftLength
from specdec.protocols import Capability, Drafter, Rows, declares
from specdec.trees import depths
from specdec.types import Draft

__all__ = ["AUTO_DRAFT_MAX", "DECAY", "LONG", "PLAIN", "POOL_DECAY", "PRIOR_WEIGHT", "PROBE_FIRST", "PROBE_LAST",
           "SHORT", "AutoDraft", "acceptance", "drafting_pays", "expected_accepted", "prior_counts"]

AUTO_DRAFT_MAX = 4  # the longest draft of `num_draft_tokens="auto"` (the compiled verify's width is this + 1)
DECAY = 0.9  # per step, on a row's acceptance counts
POOL_DECAY = 0.99  # per row and step, on the acceptance counts pooled over rows and generations
PRIOR_WEIGHT = 4.0  # observations (accepted tokens and rejections) a new row's acceptance starts from
SMOOTHING = 0.5  # the weight of a new step time in its running average
PROBE_FIRST, PROBE_LAST = 4, 64  # plain steps between probes while drafting is off: first, at most


def expected_accepted(alpha: float, k: int) -> float:
    """E[accepted] of a k-token draft whose tokens are each kept with probability α, in order:
    α + α² + … + α^k."""
    if k <= 0:
        return 0.0
    if alpha >= 1.0:
        return float(k)
    return alpha * (1.0 - alpha**k) / (1.0 - alpha)


def acceptance(accepted: float, rejections: float) -> float:
    """α from (decayed) counts of accepted tokens and of rejections, Beta(1, 1)-smoothed."""
    return (accepted + 1.0) / (accepted + rejections + 2.0)


def prior_counts(pooled: Sequence[float], weight: float = PRIOR_WEIGHT) -> list[float]:
    """A new row's [accepted, rejections] counts: the pooled ones, scaled down to at most `weight`
    observations in all (their ratio kept), so the row's own steps soon outweigh them."""
    total = pooled[0] + pooled[1]
    scale = 1.0 if total <= weight else weight / total
    return [pooled[0] * scale, pooled[1] * scale]


def drafting_pays(alphas: Sequence[float], lengths: Sequence[int], spec_seconds: float, plain_seconds: float) -> bool:
    """Whether a drafting step (row r drafting lengths[r] tokens at acceptance alphas[r]) emits more
    tokens per second than a plain step: Σ (1 + E[a_r]) / T_spec > B / T_plain."""
    tokens = sum(1.0 + expected_accepted(a, k) for a, k in zip(alphas, lengths))
    return tokens * plain_seconds > len(alphas) * spec_seconds


PLAIN, SHORT, LONG = "plain", "short", "long"  # a step's kind: no draft, one token per row, the schedule's lengths


@dataclasses.dataclass
class _Times:
    """Running step seconds at one batch size on one engine, by the kind a step turned out to be,
    and how many steps of each kind were asked for (a step asked to draft that drafted nothing,
    or one token only, is timed as the kind it turned out to be, and counts as asked all the same)."""

    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    asked: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, kind: str, seconds: float) -> None:
        old = self.seconds.get(kind)
        self.seconds[kind] = seconds if old is None else (1 - SMOOTHING) * old + SMOOTHING * seconds


class AutoDraft(AdaptiveDraftLength):
    """`inner` drafting only when it pays (the module docstring): each step is plain, a one-token
    draft per row (`SHORT`, a chain drafter's, which the engine verifies in 2 rows) or each row's
    length from the adaptive schedule (`LONG`, capped by the loop's k), whichever is expected to
    emit the most tokens per second. `decisions` records row 0's steps: (drafted?, why). `clock`
    gives the seconds steps are timed by (a test's own clock)."""

    def __init__(self, inner: Drafter | Any, start: int = AUTO_DRAFT_MAX,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(inner, start)
        self.clock = clock
        self.name = f"{getattr(self.inner, 'name', type(self.inner).__name__)}:k=auto"
        self._alpha: dict[int, list[float]] = {}  # row -> [decayed accepted tokens, decayed rejections]
        self._pool = [0.0, 0.0]  # the same, pooled over every row and generation (`POOL_DECAY`)
        self._times: dict[tuple[Any, int], _Times] = {}  # (engine, batch size) -> step seconds by kind
        self._engine: tuple[Any, ...] = ()  # this generation's engine, as the step times depend on it
        self._step: tuple[_Times, str, float, float] | None = None  # (its times, kind, start, compile seconds then)
        self._short = False  # whether this generation's engine verifies a one-token chain in 2 rows
        self._wide = False  # whether the drafter, asked for one token, drafted a tree or extra rows (no 2-row verify)
        self._off = 0  # plain steps taken in a row
        self._probe = PROBE_FIRST
        self.decisions: list[tuple[bool, str]] = []

    def prefill(self, rows: Rows) -> None:
        super().prefill(rows)  # the step times and the probe interval carry over (the module docstring)
        self._alpha = {row: prior_counts(self._pool) for row in rows}
        self._step, self._off, self.decisions = None, 0, []
        engine = next(iter(rows.values())).engine if rows else None
        self._engine = () if engine is None else (engine.compile, engine.max_draft, engine.chain_widths,
                                                   engine.draft_nodes, engine.extra_rows)
        self._short = engine is not None and 2 in engine.chain_widths and not self._wide

    def _options(self, rows: Rows, lengths: Mapping[int, int]) -> dict[str, tuple[float, dict[int, int]]]:
        """Each kind of drafting step on offer: (tokens it is expected to emit, each row's length).
        Where every row's scheduled length is one token, that is a short step."""
        prior = prior_counts(self._pool)  # for a row that joined after the prefill
        alphas = {row: acceptance(*self._alpha.get(row, prior)) for row in rows}
        short = (sum(1.0 + alphas[r] for r in rows), dict.fromkeys(rows, 1))
        if self._short and max(lengths.values()) == 1:
            return {SHORT: short}
        options = {LONG: (sum(1.0 + expected_accepted(alphas[r], lengths[r]) for r in rows), dict(lengths))}
        return {**options, SHORT: short} if self._short else options

    def _decide(self, times: _Times, rows: Rows, lengths: Mapping[int, int]) -> tuple[str, dict[int, int], str]:
        """This step's kind, each row's length and why, from the running estimates `times` (this
        engine's, at this batch size) and the rows' acceptance."""
        options = self._options(rows, lengths)
        first = next(iter(options))  # the schedule's own kind
        measuring = "measuring a drafting step"
        if times.asked.get(first, 0) < 2 and PLAIN not in times.seconds:
            return first, options[first][1], measuring
        if PLAIN not in times.seconds:
            return PLAIN, {}, "measuring a plain step"
        for kind in options:  # a kind of step not asked for twice yet
            if times.asked.get(kind, 0) < 2:
                return kind, options[kind][1], measuring + (" of one token" if kind == SHORT else "")
        plain = times.seconds[PLAIN]
        priced = [kind for kind in options if kind in times.seconds]
        if not priced:  # every drafting step asked for drafted nothing: none to time it by
            best, (tokens, best_lengths), spec = first, options[first], float("inf")
            why = "drafting: no drafting step has drafted anything yet"
        else:
            best = max(priced, key=lambda kind: options[kind][0] / times.seconds[kind])
            tokens, best_lengths = options[best]
            spec = times.seconds[best]
            why = (f"drafting{' one token' if best == SHORT else ''}: {tokens:.2f} tokens expected in "
                   f"{1e3 * spec:.1f} ms against {len(rows)} in {1e3 * plain:.1f} ms plain")
        if tokens * plain > len(rows) * spec:  # `drafting_pays`
            self._off, self._probe = 0, PROBE_FIRST
            return best, best_lengths, why
        if self._off >= self._probe:  # probe: acceptance may have risen
            self._off, self._probe = 0, min(2 * self._probe, PROBE_LAST)
            return best, best_lengths, why.replace("drafting", "probing", 1) + \
                " (drafting is off; this step checks it again)"
        self._off += 1
        return PLAIN, {}, why.replace("drafting", "plain step", 1).replace(" one token", "", 1)

    def propose(self, rows: Rows, k: Mapping[int, int]) -> Mapping[int, Draft]:
        from specdec.runtime.engine import compile_seconds

        lengths = {row: max(1, min(self._k.get(row, self.start), k[row])) for row in rows}
        times = self._times.setdefault((self._engine, len(rows)), _Times())
        kind, lengths, why = self._decide(times, rows, lengths)
        times.asked[kind] = times.asked.get(kind, 0) + 1
        drafting = kind != PLAIN
        if 0 in rows:
            self.requested.append(lengths[0] if drafting else 0)
            self.decisions.append((drafting, why))
        self._step = (times, kind, self.clock(), compile_seconds())
        if drafting:
            drafts = dict(self.inner.propose(rows, lengths))
        elif declares(self.inner, Capability.STATE):  # keep its state in step: one token, thrown away
            drafts = dict(self.inner.propose(rows, dict.fromkeys(rows, 1)))
            drafts = {row: Draft(draft.tokens[:0]) for row, draft in drafts.items()}
        else:
            drafts = {row: Draft(ctx.tokens[:0]) for row, ctx in rows.items()}
        drafts = {row: dataclasses.replace(draft, note=why) for row, draft in drafts.items()}
        self._drafts = {row: draft for row, draft in drafts.items() if drafting}
        return drafts

    def commit(self, rows: Rows, accepted: Mapping[int, int]) -> None:
        from specdec.runtime.engine import compile_seconds

        if self._step is not None:
            times, kind, start, compiled = self._step
            drafted = [draft for draft in self._drafts.values() if draft.tokens.shape[0]]
            if not drafted:
                kind = PLAIN  # nothing drafted (a prompt lookup without a match): the verify was a plain step
            elif self._short and all(draft.parents is None and draft.extra is None and draft.tokens.shape[0] == 1
                                     for draft in drafted):
                kind = SHORT  # one token in every row: the verify ran the 2-row shape
            else:
                if kind == SHORT:  # asked for one token, it drafted a tree or extra rows: no 2-row verify for it
                    self._short, self._wide = False, True
                kind = LONG
            if compile_seconds() == compiled:  # a step during which a graph compiled says nothing of its cost
                times.add(kind, self.clock() - start)
            self._step = None
        for row in rows:
            draft = self._drafts.get(row)
            if draft is not None and draft.tokens.shape[0]:
                counts = self._alpha.setdefault(row, prior_counts(self._pool))
                proposed = _reach(draft)  # a tree: kept whole when a path reaches its depth
                rejected = 1.0 if accepted[row] < proposed else 0.0
                counts[0] = DECAY * counts[0] + accepted[row]
                counts[1] = DECAY * counts[1] + rejected
                self._pool = [POOL_DECAY * self._pool[0] + accepted[row], POOL_DECAY * self._pool[1] + rejected]
        super().commit(rows, accepted)  # a thrown-away draft was verified empty: 0 accepted


def _reach(draft: Draft) -> int:
    """How deep a draft reaches: a chain's length, a tree's deepest node's depth."""
    if draft.parents is None:
        return int(draft.tokens.shape[0])
    return max(depths(draft.parents.tolist()), default=0)
