"""The decode loop: prefill, then draft -> verify -> commit -> record until every row is done.

One loop for every batch size: a generation of one prompt is a run of one row. Each part is
one function that owns one thing: `drafting.drafts` every live row's proposal and its checks,
`verify` the target's one forward and every row's verdict (`verdicts.decide`), `commit` the
rollback of the target and the drafter to each row's committed sequence, `record` the counters
and the traces. Under ranks `Run.agreement` wraps the draft and the verdicts: the leader
decides, the others receive. Plain decoding (no drafter) is the same loop with empty drafts, so
every path shares one sampling pipeline and one code path for stop ids, budgets and statistics.

Eager and compiled decoding share it too: they differ only in whether the fixed-shape steps
underneath run compiled (`specdec.runtime.engine`). The target underneath is a `RowsTarget`: for
one prompt the adapter's own cache (a chain's verify padded to k + 1 rows and read back once,
a tree's logits computed where the walk goes, the dynamic cache of eager full-attention decoding),
for several a static cache with holes (`specdec.runtime.batch_target.BatchLM`). Rows accept ragged
numbers of tokens; a row that emits a stop id or spends its budget stops drafting and leaves the
batch forward (the batch shrinks to the rows still decoding; compiled, to the next power of two).

A draft may carry extra rows (`Draft.extra`, e.g. lookahead decoding's Jacobi rows): they ride
the same forward after the draft's rows, padded to the drafter's declared `extra_rows()`, their
logits go back to the drafter in `ctx.extra_logits`, and the commit drops them with the
rejected nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace


from specdec.decoding import drafting
from specdec.decoding.drafting import Checked, call, context
from specdec.decoding.run import Row, Run
from specdec.decoding.verdicts import decide
from specdec.processing import Prefixes
from specdec.protocols import Capability, declares
from specdec.runtime.rows import Feed, Verified
from specdec.teaching.trace import CacheLengths
from specdec.types import BatchGenerations, Draft, Generation, Verdict, total_stats

__all__ = ["decode"]


@dataclass(frozen=True)
class Step:
    """One step's drafts (by row), its verify forward, each slot's verdict and stop index, and the
    seconds spent drafting and verifying."""

    drafts: dict[int, Checked]
    verified: Verified
    verdicts: dict[int, tuple[Verdict, int]]
    draft_seconds: float
    verify_seconds: float
    lengths: dict[int, tuple[int, int | None, int | None]]  # traced rows: the target's cache, and the
    # drafter's when asked and after its propose


def decode(run: Run) -> BatchGenerations:
    """Decode every row until each has spent its budget or emitted a stop id."""
    prefill(run)
    prefill_seconds = time.perf_counter() - run.start
    for row in run.rows:
        if row.trace is not None:
            row.trace.prompt, row.trace.steps = row.tokens[: row.prompt_length].tolist(), []
            row.trace.prefill_seconds = prefill_seconds
    while run.live():
        step = verify(run, *_draft(run))
        emitted = commit(run, step)
        record(run, step, emitted)
        shrink(run)
    generations = []
    for row in run.rows:
        new = row.tokens[row.prompt_length : row.length].tolist()
        generations.append(Generation(new, row.counters.stats(len(new), prefill_seconds, row.wall_seconds)))
    totals = replace(total_stats([g.stats for g in generations]), steps=run.steps, prefill_seconds=prefill_seconds,
                     draft_seconds=run.draft_seconds, verify_seconds=run.verify_seconds,
                     wall_seconds=time.perf_counter() - run.start)
    return BatchGenerations(generations, totals)


def prefill(run: Run) -> None:
    """Cache every prompt but its last id (one forward), then the drafter's prefill for every row."""
    run.slots = list(range(len(run.rows)))
    states = run.target.prefill([row.tokens[: row.prompt_length - 1] for row in run.rows], run.plan.layers)
    for slot, (row, hidden) in enumerate(zip(run.rows, states)):
        row.length = row.prompt_length
        row.ctx = context(run, row, slot, hidden, ())
    drafter = run.drafter
    if drafter is not None and declares(drafter, Capability.STATE):
        call(drafter, run.plan.name, "prefill", {row.index: row.ctx for row in run.rows})
    if run.plan.max_new_tokens == 0:  # nothing to emit: every row ends at its prompt
        for row in run.rows:
            row.done = True
        if drafter is not None and declares(drafter, Capability.LEARNS):
            call(drafter, run.plan.name, "finish", {row.index: row.ctx for row in run.rows})


def _draft(run: Run) -> tuple[dict[int, Checked], float, dict[int, tuple[int, int | None, int | None]]]:
    """Every live row's checked draft, agreed across ranks, with the seconds it took and, for traced
    rows, the target's cache length and the drafter's before and after its propose."""
    traced = [(slot, row) for slot, row in run.live() if row.trace is not None]
    before = {row.index: (run.target.cache_length(slot), _drafter_length(run, row)) for slot, row in traced}
    checked, seconds = drafting.drafts(run)
    lengths = {index: (*before[index], _drafter_length(run, run.rows[index])) for index in before}
    agreed = run.agreement.drafts([(c.draft, c.parents) for c in checked.values()], run.steps)
    checked = {index: c if own else Checked(draft, parents, None, None, own=False)
               for (index, c), (draft, parents, own) in zip(checked.items(), agreed)}
    return checked, seconds, lengths


def verify(run: Run, drafts: dict[int, Checked], draft_seconds: float,
           lengths: dict[int, tuple[int, int | None, int | None]]) -> Step:
    """One target forward over every live row's last committed id and draft, and each row's verdict,
    agreed across ranks."""
    tick = time.perf_counter()
    feeds: list[Feed | None] = [None] * len(run.slots)
    for slot, row in run.live():
        checked = drafts.get(row.index)
        draft = row.tokens[:0] if checked is None else checked.draft.tokens.clamp(0, run.lm.vocab_size - 1)
        parents = None if checked is None else checked.parents
        extra = None if checked is None else checked.draft.extra
        feeds[slot] = Feed(row.committed, draft, parents, extra)
    verified = run.target.verify(feeds, run.plan.layers)
    decided = decide(run, drafts, verified)
    slots = sorted(decided)
    agreed = run.agreement.verdicts([decided[slot] for slot in slots], run.steps, run.lm.device)
    verdicts = dict(zip(slots, agreed))
    return Step(drafts, verified, verdicts, draft_seconds, time.perf_counter() - tick, lengths)


def commit(run: Run, step: Step) -> dict[int, int]:
    """Commit each row's emitted tokens (a stop id and the budget cut the block): the target keeps
    each row's accepted path, then the drafter rolls back. Returns the tokens each slot emitted."""
    plan = run.plan
    paths: list[list[int] | None] = [None] * len(run.slots)
    committed: dict[int, int] = {}
    finished: list[Row] = []
    emitted_by_slot: dict[int, int] = {}
    for slot, row in run.live():
        verdict, stop_at = step.verdicts[slot]
        checked = step.drafts.get(row.index)
        emitted = min(verdict.num_accepted + 1, stop_at + 1, plan.max_new_tokens - row.produced)
        chain = checked is None or checked.parents is None
        path = list(range(emitted)) if chain else [0] + [node + 1 for node in verdict.accepted_nodes][: emitted - 1]
        paths[slot] = path
        emitted_by_slot[slot] = emitted
        row.tokens[row.length : row.length + emitted] = verdict.tokens[:emitted]
        if row.pipeline.matcher is not None:
            row.pipeline.commit(row.tokens[row.length : row.length + emitted].tolist())
        row.length += emitted
        row.produced += emitted
        states = step.verified.states[slot]
        hidden = None if states is None else states[:emitted] if chain else states[path]
        accepted = verdict.accepted_nodes[: min(verdict.num_accepted, emitted)]
        if checked is not None and checked.nodes is not None:  # a tree verified as its first path
            accepted = tuple(checked.nodes[i] for i in accepted)
        row.ctx = context(run, row, slot, hidden, accepted, step.verified.extra[slot])
        if checked is not None:
            committed[row.index] = min(verdict.num_accepted, emitted)
        if stop_at < emitted or row.produced >= plan.max_new_tokens:
            row.done = True
            row.wall_seconds = time.perf_counter() - run.start
            finished.append(row)
    run.target.commit(paths)
    tick = time.perf_counter()
    drafter = run.drafter
    if committed and drafter is not None and declares(drafter, Capability.STATE):
        call(drafter, plan.name, "commit", {i: run.rows[i].ctx for i in committed}, committed)
    if finished and drafter is not None and declares(drafter, Capability.LEARNS):
        call(drafter, plan.name, "finish", {row.index: row.ctx for row in finished})
    run.draft_seconds += step.draft_seconds + time.perf_counter() - tick  # the drafter's commit counts too
    run.verify_seconds += step.verify_seconds
    run.steps += 1
    return emitted_by_slot


def record(run: Run, step: Step, emitted: dict[int, int]) -> None:
    """Count the step for every row it ran (each drafting row its share of the drafter's seconds),
    and add it to the traced rows' traces."""
    share = (run.draft_seconds - run.recorded_draft_seconds) / max(1, len(step.drafts))
    run.recorded_draft_seconds = run.draft_seconds
    for slot, index in enumerate(run.slots):
        if index is None or slot not in emitted:
            continue
        row = run.rows[index]
        verdict, _ = step.verdicts[slot]
        checked = step.drafts.get(index)
        n = 0 if checked is None else checked.draft.tokens.shape[0]
        reached = 0 if checked is None else checked.reached
        seconds = share if checked is not None else 0.0
        row.counters.step(n, reached, verdict.num_accepted, seconds, step.verify_seconds)
        if row.trace is not None:
            _trace(run, step, slot, row, checked, verdict, emitted[slot], seconds)


def _trace(run: Run, step: Step, slot: int, row: Row, checked: Checked | None, verdict: Verdict,
           emitted: int, seconds: float) -> None:
    """The traced row's step: its draft, the logits the verify gave it, its verdict, its caches."""
    assert row.trace is not None
    draft = checked.draft if checked is not None else Draft(row.tokens[:0])
    parents = None if checked is None else checked.parents
    rows = step.verified.rows[slot]
    assert rows is not None
    shown = rows.all() if parents is not None else rows.all()[: draft.tokens.shape[0] + 1]
    prefixes = Prefixes.of_verify(row.tokens[: row.length - emitted], row.prompt_length, draft.tokens, parents) \
        if run.plan.sampling.reads_prefix else None
    target_before, drafter_asked, drafter_drafted = step.lengths[row.index]
    extra = 0 if draft.extra is None else draft.extra.tokens.shape[0]
    target = (target_before, target_before + draft.tokens.shape[0] + 1 + extra, run.target.cache_length(slot))
    after = _drafter_length(run, row)
    drafter = None
    if after is not None:
        asked = (drafter_asked, drafter_drafted) if checked is not None and drafter_asked is not None \
            and drafter_drafted is not None else (after, after)  # not asked: unchanged
        drafter = (*asked, after)
    row.trace.record(draft, shown, row.pipeline, prefixes, verdict, emitted, seconds, step.verify_seconds, parents,
                     CacheLengths(target, drafter))


def _drafter_length(run: Run, row: Row) -> int | None:
    """The positions the drafter's own cache holds for `row`, when it reports them."""
    drafter = run.drafter
    if drafter is None or not declares(drafter, Capability.CACHE_LENGTH):
        return None
    length = drafter.cache_length(row.index)  # type: ignore[attr-defined]
    return length if isinstance(length, int) and not isinstance(length, bool) else None


def shrink(run: Run) -> None:
    """Drop finished rows from the target's forward: to the rows still decoding, or when compiled
    to the next power of two at or above their number (finished rows fill the rest, idle)."""
    live = [slot for slot, _ in run.live()]
    if not live:
        return
    size = 1 << (len(live) - 1).bit_length() if run.buckets else len(live)
    if size >= len(run.slots):
        return
    idle = [slot for slot in range(len(run.slots)) if slot not in live]
    keep = sorted(live + idle[: size - len(live)])
    run.target.select(keep)
    run.slots = [run.slots[slot] if slot in live else None for slot in keep]
    for slot, row in run.live():  # each context names its row's new slot
        assert row.ctx is not None
        row.ctx = replace(row.ctx, slot=slot)
