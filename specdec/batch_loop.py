"""The batch decode loop (`specdec.generate_batch`): prefill every row, then draft -> verify ->
commit for all rows still decoding, one batched target forward per step.

Each row is a generation of its own: its committed ids, its own budget, its stop ids, its
generator, its drafter state and counters. A step asks the drafter for every live row's draft
(`specdec.batch_drafters`), checks each as the batch-1 loop does, lays every row's draft out on
the same R rows (chains padded to k + 1, trees to the node budget and the extra rows, a chain
as a chain-shaped tree when another row drafted a tree: `specdec.trees.verify_layout`), runs
one forward over the batch (`specdec.batch_target.BatchLM`: a static cache with holes, each row
at its own positions), and takes each row's verdict with the batch-1 verifier functions; greedy
chains take theirs for the whole batch at once, read back with the stop ids and the drafts'
faults in one transfer. Rows accept ragged numbers of tokens; a row that emits a stop id or
spends its budget stops drafting, and leaves the batch forward: the batch shrinks to the rows
still decoding (to the next power of two when compiled, so graphs keep a few batch shapes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from specdec.agreement import agree_drafts, agree_verdicts
from specdec.batch_target import BatchLM
from specdec.counters import Counters
from specdec.engine import Engine
from specdec.loop import hidden_layers
from specdec.protocols import DraftContext, Drafter
from specdec.sampling import probabilities
from specdec.target import CausalLM
from specdec.trees import chain_parents, depths, verify_layout
from specdec.types import BatchGenerations, Draft, Generation, Sampling, Stats, Verdict, total_stats
from specdec.verifier import (
    DraftError,
    chain_verdict,
    draft_faults,
    greedy_verdicts,
    validate_draft,
    verify_tree,
    verify_tree_greedy,
)

__all__ = ["BatchRun", "Row", "decode_batch"]


@dataclass
class Row:
    """One prompt's generation. `tokens` holds the committed ids in [0, length), then scratch."""

    index: int
    tokens: torch.Tensor
    prompt_length: int
    generator: torch.Generator
    counters: Counters
    length: int = 0
    produced: int = 0
    done: bool = False
    ctx: DraftContext | None = None
    wall_seconds: float = 0.0


@dataclass
class BatchRun:
    """The state of one batch. `slots[s]`: the row in batch slot s of the target's cache (None
    for a slot kept only to hold the batch at its compiled shape)."""

    target: BatchLM
    lm: CausalLM
    drafter: Any  # the batched protocol (`specdec.batch_drafters`), or None for plain decoding
    declared: Drafter | None  # the drafter whose declarations hold (hidden layers, tree budget)
    name: str
    k: int
    max_new_tokens: int
    sampling: Sampling
    stop: frozenset[int]
    engine: Engine
    rows: list[Row]
    buckets: bool  # compiled: the batch shrinks to powers of two
    slots: list[int | None] = field(default_factory=list)
    layers: tuple[int, ...] = ()
    steps: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    layouts: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


@dataclass(frozen=True)
class Checked:
    """A row's draft after the checks: its parents (None for a chain) and, for a chain whose
    values were not read yet, their fault flag (0-d, read with the verdict)."""

    draft: Draft
    parents: list[int] | None
    faults: torch.Tensor | None
    own: bool = True  # under ranks: this rank's draft is the leader's (it can decide the row's verdict)


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
    """One forward over every prompt but its last id (right-padded: a padding query sees only
    itself, and no row keeps a padding column); then the drafter's prefill for every row."""
    lm, rows = run.lm, run.rows
    run.layers = hidden_layers(run.declared, run.name, lm) if run.declared is not None else ()
    run.slots = list(range(len(rows)))
    width = max(row.prompt_length for row in rows) - 1
    states = None
    if width > 0:
        lengths = torch.tensor([row.prompt_length - 1 for row in rows], device=lm.device)  # (B,)
        column = torch.arange(width, device=lm.device)  # (P,)
        real = column[None] < lengths[:, None]  # (B, P)
        ids = torch.where(real, torch.stack([row.tokens[:width] for row in rows]), 0)  # (B, P)
        eye = torch.eye(width, dtype=torch.bool, device=lm.device)
        visible = (torch.ones(width, width, dtype=torch.bool, device=lm.device).tril()[None] & real[:, None, :]) | \
            (eye[None] & ~real[:, :, None])  # (B, P, P)
        _, states = run.target.forward(ids, column.expand(len(rows), width), visible, run.layers, fixed=False, keep=1)
        kept = real.nonzero().tolist()
        run.target.keep([b for b, _ in kept], [c for _, c in kept])
    ctxs = {}
    for b, row in enumerate(rows):
        row.length = row.prompt_length
        hidden = None if not run.layers else states[b, : row.prompt_length - 1] if states is not None else \
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
    ids, positions, visible = _lay_out(run, drafts, width, rows)
    logits, states = run.target.forward(ids, positions, visible, run.layers)  # (S, R, V), (S, R, m * H)
    verdicts = _verdicts(run, drafts, logits, ids, tree)
    if run.lm.ranks is not None:  # every rank commits the leader's verdicts (`specdec.ranks`)
        slots = sorted(slot for slot, _ in _live(run))
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
    for slot, row in _live(run):
        index, verdict = row.index, verdicts[slot]
        checked = drafts.get(index)
        tokens = verdict.tokens.tolist()
        stop_at = next((i for i, token in enumerate(tokens) if token in run.stop), len(tokens))
        emitted = min(len(tokens), stop_at + 1, run.max_new_tokens - row.produced)
        columns = [0] + [node + 1 for node in verdict.accepted_nodes][: emitted - 1]  # the root, then the path
        keep_slots += [slot] * len(columns)
        keep_columns += columns
        row.tokens[row.length : row.length + emitted] = verdict.tokens[:emitted]
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
        reached = (max(depths(checked.parents), default=0) if checked.parents is not None else n) if checked else 0
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
    budgets = {row.index: min(run.k, run.max_new_tokens - row.produced - 1) for _, row in _live(run)}
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
    if ranks is not None:  # every rank lays out the leader's drafts (`specdec.ranks`)
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
    if parents is not None and len(parents) > engine.draft_nodes:
        said = f"its max_draft_nodes({run.k}) is" if engine.declared else \
            "a drafter that declares no max_draft_nodes(k) may draft at most"
        raise DraftError(f"drafter {run.name!r} returned a tree of {len(parents)} nodes, but {said} "
                         f"{engine.draft_nodes}; declare the largest tree it drafts (max_draft_nodes)")
    return Checked(proposed, parents, None)


def _lay_out(run: BatchRun, drafts: dict[int, Checked], width: int, rows: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each slot's R = `rows` ids, positions and visibility among them: [S, R], [S, R], [S, R, R].
    A live row feeds its last committed id and its draft (a tree padded to `width` rows, then
    its extra rows padded to the declared count); an idle slot feeds pad ids seeing themselves."""
    device = run.lm.device
    ids, positions, visible = [], [], []
    idle = torch.eye(rows, dtype=torch.bool, device=device), torch.zeros(rows, dtype=torch.long, device=device)
    for index in run.slots:
        row = None if index is None or run.rows[index].done else run.rows[index]
        if row is None:
            ids.append(torch.zeros(rows, dtype=torch.long, device=device))
            seen, offsets = idle
        else:
            checked = drafts.get(row.index)
            draft_ = None if checked is None else checked.draft
            tokens = row.tokens[:0] if draft_ is None else draft_.tokens.clamp(0, run.lm.vocab_size - 1)
            n = tokens.shape[0]
            extra = None if draft_ is None or draft_.extra is None else draft_.extra.padded(rows - width)
            parents = None if checked is None else checked.parents
            seen, offsets = _layout(run, parents, n, width, extra, rows)
            feed = [row.tokens[row.length - 1 : row.length], tokens, tokens.new_zeros(width - n - 1)]
            if extra is not None:
                feed.append(extra.tokens)
            ids.append(torch.cat(feed + [tokens.new_zeros(rows - width - (0 if extra is None else
                                                                            extra.tokens.shape[0]))]))
            offsets = offsets + (row.length - 1)
        positions.append(offsets)
        visible.append(seen)
    return torch.stack(ids), torch.stack(positions), torch.stack(visible)


def _layout(run: BatchRun, parents: list[int] | None, n: int, width: int, extra: Any, rows: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Visibility [R, R] and position offsets [R] of one row's draft (`verify_layout`), padded to
    `rows` with rows that see only themselves; a chain's is kept per length."""
    key = (n, width, rows)
    if parents is None and extra is None and key in run.layouts:
        return run.layouts[key]
    seen, offsets = verify_layout(parents if parents is not None else chain_parents(n), width, extra, run.lm.device)
    if seen.shape[0] < rows:
        pad = rows - seen.shape[0]
        full = torch.eye(rows, dtype=torch.bool, device=run.lm.device)
        full[: seen.shape[0], : seen.shape[0]] = seen
        seen, offsets = full, torch.cat([offsets, offsets.new_zeros(pad)])
    if parents is None and extra is None:
        run.layouts[key] = (seen, offsets)
    return seen, offsets


def _verdicts(run: BatchRun, drafts: dict[int, Checked], logits: torch.Tensor, ids: torch.Tensor, tree: bool
              ) -> dict[int, Verdict]:
    """Each live slot's verdict. Greedy chains: all at once, one read of the numbers accepted,
    the argmax rows and the faults; otherwise row by row with the batch-1 verifier functions.
    Under ranks, a sampled row whose draft was not this rank's own has none (the leader's comes)."""
    live = _live(run)
    if run.sampling.greedy and not tree:
        argmax = logits.argmax(dim=-1)  # (S, R)
        lengths = torch.tensor(_lengths(run, drafts), device=argmax.device)  # (S,)
        num = greedy_verdicts(argmax, ids[:, 1:], lengths)  # (S,)
        faults = _faults(run, drafts)  # (S,)
        read = torch.cat([num[:, None], faults[:, None].long(), argmax], dim=1).tolist()
        out = {}
        for slot, row in live:
            accepted, broken = read[slot][0], read[slot][1]
            if broken:
                _name_fault(run, row.index, drafts[row.index].draft)
            out[slot] = Verdict(torch.tensor(read[slot][2 : 3 + accepted], device=ids.device), accepted)
        return out
    host = logits.argmax(dim=-1).tolist() if run.sampling.greedy else None  # (S, R)
    out = {}
    for slot, row in live:
        checked = drafts.get(row.index)
        draft_ = Draft(ids[slot, :0]) if checked is None else checked.draft
        parents = None if checked is None else checked.parents
        if host is not None:
            argmax_row = host[slot]
            out[slot] = verify_tree_greedy(argmax_row.__getitem__, draft_.tokens,
                                           parents if parents is not None else chain_parents(draft_.tokens.shape[0]))
        elif checked is not None and not checked.own:
            continue  # the leader decides a row whose draft this rank did not draft
        elif parents is not None:
            out[slot] = verify_tree(lambda r, s=slot: probabilities(logits[s, r], run.sampling), draft_.tokens,
                                    parents, draft_.probs, row.generator)
        else:
            n = draft_.tokens.shape[0]
            p = probabilities(logits[slot, : n + 1], run.sampling)  # (n + 1, V)
            num, tokens, acceptance, uniforms = chain_verdict(p, draft_.tokens, draft_.probs, row.generator)
            faults = checked.faults if checked is not None and checked.faults is not None else \
                torch.zeros((), dtype=torch.bool, device=p.device)
            accepted, broken = torch.stack([num, faults.long()]).tolist()
            if broken:
                _name_fault(run, row.index, draft_)
            out[slot] = Verdict(tokens[: accepted + 1], accepted, acceptance, uniforms)
    return out


def _lengths(run: BatchRun, drafts: dict[int, Checked]) -> list[int]:
    """Each slot's draft length (0 for a slot that drafted nothing or holds no live row)."""
    lengths = []
    for index in run.slots:
        checked = None if index is None else drafts.get(index)
        lengths.append(0 if checked is None else checked.draft.tokens.shape[0])
    return lengths


def _faults(run: BatchRun, drafts: dict[int, Checked]) -> torch.Tensor:
    """Each slot's chain fault flag [S] (False where no values are left to check)."""
    flags = []
    for index in run.slots:
        checked = None if index is None else drafts.get(index)
        flag = None if checked is None else checked.faults
        flags.append(flag if flag is not None else torch.zeros((), dtype=torch.bool, device=run.lm.device))
    return torch.stack(flags)


def _name_fault(run: BatchRun, index: int, draft_: Draft) -> None:
    try:
        validate_draft(draft_, run.k, run.lm.vocab_size, run.lm.device, run.name)
    except DraftError as error:
        raise DraftError(f"{error} (row {index} of the batch)") from error
    raise DraftError(f"drafter {run.name!r} returned a broken draft (row {index} of the batch)")


def shrink(run: BatchRun) -> None:
    """Drop finished rows from the batch forward: to the rows still decoding, or when compiled to
    the next power of two at or above their number (finished rows fill the rest, idle)."""
    live = [slot for slot, _ in _live(run)]
    if not live:
        return
    size = 1 << (len(live) - 1).bit_length() if run.buckets else len(live)
    if size >= len(run.slots):
        return
    idle = [slot for slot in range(len(run.slots)) if slot not in live]
    keep = sorted(live + idle[: size - len(live)])
    run.target.select(keep)
    run.slots = [run.slots[slot] if slot in live else None for slot in keep]


def _live(run: BatchRun) -> list[tuple[int, Row]]:
    """(batch slot, row) of every row still decoding."""
    return [(slot, run.rows[index]) for slot, index in enumerate(run.slots)
            if index is not None and not run.rows[index].done]


def _context(run: BatchRun, row: Row, hidden: torch.Tensor | None, accepted: tuple[int, ...],
             extra_logits: torch.Tensor | None = None) -> DraftContext:
    return DraftContext(row.tokens[: row.length], run.sampling, row.generator, run.lm, run.lm.vocab_size, hidden,
                        accepted, run.engine, extra_logits)


def _totals(run: BatchRun, generations: list[Generation], prefill_seconds: float, wall_seconds: float) -> Stats:
    """The batch's counters: its batched forwards, every row's tokens and drafts, its seconds."""
    rows = total_stats([g.stats for g in generations])
    return replace(rows, steps=run.steps, prefill_seconds=prefill_seconds, draft_seconds=run.draft_seconds,
                   verify_seconds=run.verify_seconds, wall_seconds=wall_seconds)
