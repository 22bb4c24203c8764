"""The batch decode loop (`specdec.generate_batch`): prefill every row, then draft -> verify ->
commit for all rows still decoding, one batched target forward per step.

Each row is a generation of its own: its committed ids, its own budget, its stop ids, its
generator, its drafter state and counters. A step asks the drafter for every live row's draft
(`specdec.decoding.batch_drafters`), checks each as the batch-1 loop does, lays every row's draft out on
the same R rows (chains padded to k + 1, trees to the node budget and the extra rows, a chain
as a chain-shaped tree when another row drafted a tree: `specdec.trees.verify_layout`), runs
one forward over the batch (`specdec.runtime.batch_target.BatchLM`: a static cache with holes, each row
at its own positions), and takes each row's verdict with the batch-1 verifier functions; greedy
chains take theirs for the whole batch at once, read back with the stop ids and the drafts'
faults in one transfer. Rows accept ragged numbers of tokens; a row that emits a stop id or
spends its budget stops drafting, and leaves the batch forward: the batch shrinks to the rows
still decoding (to the next power of two when compiled, so graphs keep a few batch shapes).
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from specdec.decoding.batch_state import BatchRun, Checked, Row, live_rows
from specdec.decoding.batch_verify import lay_out, row_verdicts
from specdec.decoding.drafts import check_tree_size, hidden_layers
from specdec.distributed.agreement import agree_drafts, agree_verdicts
from specdec.protocols import DraftContext
from specdec.trees import depths
from specdec.types import BatchGenerations, Draft, Generation, Stats, total_stats
from specdec.verifier import DraftError, draft_faults, validate_draft

__all__ = ["decode_batch"]


def decode_batch(run: BatchRun) -> BatchGenerations:
    """Decode every row until each has spent its budget or emitted a stop id."""
    start = time.perf_counter()
    prefill(run)
    prefill_seconds = time.perf_counter() - start
    while any(not row.done for row in run.rows):
        step(run, start)
        shrink(run)
    generations = []
    for row in run.rows:
        new = row.tokens[row.prompt_length : row.length].tolist()
        generations.append(Generation(new, row.counters.stats(len(new), prefill_seconds, row.wall_seconds)))
    return BatchGenerations(generations, _totals(run, generations, prefill_seconds, time.perf_counter() - start))


def prefill(run: BatchRun) -> None:
    """One forward over every prompt but its last id (left-padded, `BatchLM.prefill`); then the
    drafter's prefill for every row."""
    lm, rows = run.lm, run.rows
    run.layers = hidden_layers(run.declared, run.name, lm) if run.declared is not None else ()
    run.slots = list(range(len(rows)))
    width = max(row.prompt_length for row in rows) - 1
    states = run.target.prefill([row.tokens[: row.prompt_length - 1] for row in rows], run.layers)  # (B, P, m * H)
    ctxs = {}
    for b, row in enumerate(rows):
        row.length = row.prompt_length
        hidden = None if not run.layers else states[b, width - row.prompt_length + 1 :] if states is not None else \
            torch.empty(0, len(run.layers) * lm.hidden_size, dtype=lm.dtype, device=lm.device)
        row.ctx = _context(run, row, hidden, ())
        ctxs[row.index] = row.ctx
    if run.drafter is not None and hasattr(run.drafter, "prefill_batch"):
        run.drafter.prefill_batch(ctxs)


def step(run: BatchRun, start: float) -> None:
    """Draft for every live row, one batched forward, each row's verdict, and commit."""
    tick = time.perf_counter()
    drafts = draft(run)
    draft_seconds = time.perf_counter() - tick
    tick = time.perf_counter()
    tree = any(c.parents is not None or c.draft.extra is not None for c in drafts.values())
    longest = max((c.draft.tokens.shape[0] for c in drafts.values()), default=0)
    width = run.engine.tree_rows(longest) if tree else run.k + 1 if longest else 1  # the tree's rows, root included
    rows = width + (run.engine.extra_rows if tree else 0)
    ids, positions, visible = lay_out(run, drafts, width, rows)
    # a tree's rows reach depth 1 + its deepest node's (padding nodes hang off the root: 2); at
    # least 1 + k, so the steps of one decode share one compiled graph
    depth = 1 + max([1, run.k] + [_reached(c) for c in drafts.values()]) if tree else None
    logits, states = run.target.forward(ids, positions, visible, run.layers, depth=depth)  # (S, R, V), (S, R, m * H)
    verdicts = row_verdicts(run, drafts, logits, ids, tree)
    if run.lm.ranks is not None:  # every rank commits the leader's verdicts (`specdec.distributed.ranks`)
        slots = sorted(slot for slot, _ in live_rows(run))
        agreed = agree_verdicts(run.lm.ranks, [(verdicts.get(slot), 0) for slot in slots], rows,
                                f"verdicts of batch step {run.steps}", run.lm.device)
        verdicts = {slot: verdict for slot, (verdict, _) in zip(slots, agreed)}
    verify_seconds = time.perf_counter() - tick
    seconds = getattr(run.drafter, "seconds", None) or {}
    share = draft_seconds / max(1, len(drafts))
    committed: dict[int, int] = {}
    finished: dict[int, DraftContext] = {}
    keep_slots: list[int] = []
    keep_columns: list[int] = []
    for slot, row in live_rows(run):
        index, verdict = row.index, verdicts[slot]
        checked = drafts.get(index)
        tokens = verdict.tokens.tolist()
        stop_at = next((i for i, token in enumerate(tokens) if token in run.stop), len(tokens))
        emitted = min(len(tokens), stop_at + 1, run.max_new_tokens - row.produced)
        columns = [0] + [node + 1 for node in verdict.accepted_nodes][: emitted - 1]  # the root, then the path
        keep_slots += [slot] * len(columns)
        keep_columns += columns
        row.tokens[row.length : row.length + emitted] = verdict.tokens[:emitted]
        if row.pipeline is not None and row.pipeline.matcher is not None:
            row.pipeline.commit(tokens[:emitted])
        row.length += emitted
        row.produced += emitted
        accepted = min(verdict.num_accepted, emitted)
        extra = None if checked is None or checked.draft.extra is None else \
            logits[slot, width : width + checked.draft.extra.tokens.shape[0]]  # (m, V)
        hidden = None if states is None else states[slot, columns]
        row.ctx = _context(run, row, hidden, verdict.accepted_nodes[:accepted], extra)
        if checked is not None:
            committed[index] = accepted
        n = 0 if checked is None else checked.draft.tokens.shape[0]
        reached = _reached(checked) if checked is not None else 0
        row.counters.step(n, reached, verdict.num_accepted, seconds.get(index, share) if checked else 0.0,
                          verify_seconds)
        if stop_at < emitted or row.produced >= run.max_new_tokens:
            row.done = True
            row.wall_seconds = time.perf_counter() - start
            finished[index] = row.ctx
    run.target.keep(keep_slots, keep_columns)
    tick = time.perf_counter()
    if committed and hasattr(run.drafter, "commit_batch"):
        run.drafter.commit_batch({i: run.rows[i].ctx for i in committed}, committed)
    if finished and hasattr(run.drafter, "finish_batch"):
        run.drafter.finish_batch(finished)
    run.steps += 1
    run.draft_seconds += draft_seconds + time.perf_counter() - tick  # the drafter's commit and finish count too
    run.verify_seconds += verify_seconds


def draft(run: BatchRun) -> dict[int, Checked]:
    """Every live row's draft, checked (a broken one names its row); rows with a budget of one
    token left, and every row in plain decoding, draft nothing."""
    if run.drafter is None or run.k == 0:
        return {}
    budgets = {row.index: min(run.k, run.max_new_tokens - row.produced - 1) for _, row in live_rows(run)}
    budgets = {index: k for index, k in budgets.items() if k > 0}
    if not budgets:
        return {}
    proposed = run.drafter.propose_batch({index: run.rows[index].ctx for index in budgets}, budgets)
    checked = {}
    for index, k in budgets.items():
        try:
            checked[index] = _check(run, proposed.get(index) if isinstance(proposed, dict) else None, k)
        except DraftError as error:
            raise DraftError(f"{error} (row {index} of the batch)") from error
    ranks = run.lm.ranks
    if ranks is not None:  # every rank lays out the leader's drafts (`specdec.distributed.ranks`)
        agreed = agree_drafts(ranks, [(c.draft, c.parents) for c in checked.values()], run.engine,
                              f"drafts of batch step {run.steps}")
        checked = {index: c if own else Checked(draft_, parents, None, own=False)
                   for (index, c), (draft_, parents, own) in zip(checked.items(), agreed)}
    return checked


def _check(run: BatchRun, proposed: object, k: int) -> Checked:
    """validate_draft as the batch-1 loop applies it: the host's checks now, a chain's values
    read with the verdict, a tree's (walked on the host) now, and a tree's size."""
    if proposed is None:
        raise DraftError(f"drafter {run.name!r}: propose_batch returned no draft for this row")
    engine, vocab = run.engine, run.lm.vocab_size
    parents = validate_draft(proposed, k, vocab, run.lm.device, run.name, values=False, extra_rows=engine.extra_rows)
    assert isinstance(proposed, Draft)
    if parents is None and proposed.extra is None:
        return Checked(proposed, None, draft_faults(proposed, vocab) if proposed.tokens.numel() else None)
    validate_draft(proposed, k, vocab, run.lm.device, run.name, extra_rows=engine.extra_rows)
    if parents is not None:
        check_tree_size(run.name, run.k, engine, parents)
    return Checked(proposed, parents, None)


def _reached(checked: Checked) -> int:
    """The depth a checked draft reaches: its deepest node's, or a chain's length."""
    return max(depths(checked.parents), default=0) if checked.parents is not None else checked.draft.tokens.shape[0]


def shrink(run: BatchRun) -> None:
    """Drop finished rows from the batch forward: to the rows still decoding, or when compiled to
    the next power of two at or above their number (finished rows fill the rest, idle)."""
    live = [slot for slot, _ in live_rows(run)]
    if not live:
        return
    size = 1 << (len(live) - 1).bit_length() if run.buckets else len(live)
    if size >= len(run.slots):
        return
    idle = [slot for slot in range(len(run.slots)) if slot not in live]
    keep = sorted(live + idle[: size - len(live)])
    run.target.select(keep)
    run.slots = [run.slots[slot] if slot in live else None for slot in keep]


def _context(run: BatchRun, row: Row, hidden: torch.Tensor | None, accepted: tuple[int, ...],
             extra_logits: torch.Tensor | None = None) -> DraftContext:
    return DraftContext(row.tokens[: row.length], run.sampling, row.generator, run.lm, run.lm.vocab_size, hidden,
                        accepted, run.engine, extra_logits, run.max_new_tokens - row.produced, row.pipeline,
                        run.tokenizer)


def _totals(run: BatchRun, generations: list[Generation], prefill_seconds: float, wall_seconds: float) -> Stats:
    """The batch's counters: its batched forwards, every row's tokens and drafts, its seconds."""
    rows = total_stats([g.stats for g in generations])
    return replace(rows, steps=run.steps, prefill_seconds=prefill_seconds, draft_seconds=run.draft_seconds,
                   verify_seconds=run.verify_seconds, wall_seconds=wall_seconds)
