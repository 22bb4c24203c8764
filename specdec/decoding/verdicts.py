"""Each row's verdict on its draft, from one verify forward: one dispatch per rule, whatever the
batch size, and one read back for the whole step.

- Greedy chains, when the forward computed every row's logits: every slot's argmax at once and
  the numbers accepted at once (`greedy_verdicts`).
- Sampled chains: the run's chain rule (`chain_rule`: token-wise or block) per row, on the device.
- Trees: the run's tree rule (`tree_rule`: the sibling rule or traversal; `verify_tree_greedy` at
  temperature 0) per row, walked on the host, each row's logits computed where the walk goes
  when the model allows (`TreeLogits`).

Each row's p comes from its own pipeline and, when the settings read it, its own prefix (the
committed ids, then the row's draft path); each tree node's q as its siblings were drawn
(`sibling_rows`). The numbers accepted, where a stop id fell and the chains' draft faults of
every row are read back in one transfer. Under ranks, a sampled row whose draft was not this
rank's own gets no verdict here (the leader's comes through `Run.agreement`).
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.decoding.drafting import Checked, name_fault
from specdec.decoding.run import Row, Run
from specdec.processing import Prefixes
from specdec.runtime.rows import Verified
from specdec.runtime.tree_logits import TreeLogits
from specdec.sampling import greedy_ids
from specdec.types import Draft, Verdict
from specdec.verifier import chain_rule, greedy_verdict, greedy_verdicts, sibling_rows, tree_rule, verify_tree_greedy

__all__ = ["decide", "first_stop", "prefixes"]


def decide(run: Run, drafts: dict[int, Checked], verified: Verified) -> dict[int, tuple[Verdict | None, int]]:
    """Every live slot's verdict and the index of the first stop id among its tokens (len(tokens)
    when none), keyed by slot."""
    live = run.live()
    greedy = run.plan.sampling.greedy
    trees = any(checked.parents is not None for checked in drafts.values())
    if greedy and not trees and verified.logits is not None:
        pending = _greedy_chains(run, drafts, verified.logits, live)
    else:
        pending = {}
        host = None
        if greedy and trees and verified.logits is not None:
            host = _argmax_rows(run, drafts, verified.logits, live).tolist()  # (S, R): every tree walk reads them
        for slot, row in live:
            checked = _checked(drafts, row)
            rows = verified.rows[slot]
            assert rows is not None
            if not greedy and not checked.own:
                continue  # the leader decides a row whose draft this rank did not draft
            if checked.parents is not None:
                pending[slot] = _tree(run, row, checked, rows, None if host is None else host[slot])
            else:
                pending[slot] = _chain(run, row, checked, rows)
    return _read(run, drafts, pending)


def _checked(drafts: dict[int, Checked], row: Row) -> Checked:
    """The row's checked draft, or an empty one for a row that drafted nothing."""
    checked = drafts.get(row.index)
    return checked if checked is not None else Checked(Draft(row.tokens[:0]))


def _greedy_chains(run: Run, drafts: dict[int, Checked], logits: torch.Tensor, live: list[tuple[int, Row]]
                   ) -> dict[int, Any]:
    """Every slot's greedy chain verdict at once: (num 0-d, out [R], acceptance or None, None, faults 0-d)."""
    argmax = _argmax_rows(run, drafts, logits, live)  # (S, R)
    width = argmax.shape[1] - 1
    lengths, drafted = [], []
    for index in run.slots:
        checked = None if index is None else drafts.get(index)
        tokens = argmax.new_zeros(0) if checked is None else checked.draft.tokens.clamp(0, run.lm.vocab_size - 1)
        lengths.append(tokens.shape[0])
        drafted.append(torch.cat([tokens, tokens.new_zeros(width - tokens.shape[0])]))
    draft_ids = torch.stack(drafted)  # (S, R - 1)
    num = greedy_verdicts(argmax, draft_ids, torch.tensor(lengths, device=argmax.device))  # (S,)
    out = {}
    for slot, row in live:
        checked = _checked(drafts, row)
        n = lengths[slot]
        acceptance = (draft_ids[slot, :n] == argmax[slot, :n]).float() if row.trace is not None else None
        out[slot] = (num[slot], argmax[slot, : n + 1], acceptance, None, checked.faults)
    return out


def _argmax_rows(run: Run, drafts: dict[int, Checked], logits: torch.Tensor, live: list[tuple[int, Row]]
                 ) -> torch.Tensor:
    """The greedy id of every verify row of every slot [S, R]: the argmax of the logits, after the
    bias and the bans, and, where the settings read the prefix, of each live row's processed
    scores from its own prefixes."""
    sampling = run.plan.sampling
    if sampling.plain:
        return logits.argmax(dim=-1)
    if not sampling.reads_prefix:
        return greedy_ids(logits, sampling)
    argmax = logits.argmax(dim=-1)  # (S, R); the live rows' processed below
    for slot, row in live:
        checked = _checked(drafts, row)
        n = checked.draft.tokens.shape[0]
        argmax[slot, : n + 1] = row.pipeline.argmax(logits[slot, : n + 1], prefixes(row, checked))
    return argmax


def _chain(run: Run, row: Row, checked: Checked, rows: TreeLogits) -> tuple[Any, ...]:
    """One row's chain verdict on the device: (num 0-d, out [n + 1], acceptance, uniforms, faults 0-d)."""
    plan, draft = run.plan, checked.draft
    n = draft.tokens.shape[0]
    drafted = draft.tokens.clamp(0, run.lm.vocab_size - 1)  # a broken draft's fault is read with the verdict
    logits = rows.all()[: n + 1]  # (n + 1, V)
    if plan.sampling.greedy:
        argmax = logits.argmax(dim=-1) if plan.sampling.plain else row.pipeline.argmax(logits, prefixes(row, checked))
        num, out, matches = greedy_verdict(argmax, drafted)
        return num, out, matches, None, checked.faults
    p = row.pipeline.probabilities(logits, prefixes(row, checked))  # (n + 1, V)
    num, out, acceptance, uniforms = chain_rule(plan.verify_rule)(p, drafted, draft.probs, row.generator)
    return num, out, acceptance, uniforms, checked.faults


def _tree(run: Run, row: Row, checked: Checked, rows: TreeLogits, argmax: list[int] | None) -> Verdict:
    """One row's tree verdict under the run's rule, walked on the host; each node's p from its own
    path when the settings read the prefix (all rows at once then: a constraint's matcher walks
    the tree once), each node's q as its siblings were drawn (`sibling_rows`)."""
    plan, draft, parents = run.plan, checked.draft, checked.parents
    assert parents is not None
    pipeline, sampling = row.pipeline, plan.sampling
    verify_tree = tree_rule(plan.verify_rule)
    q = None if sampling.greedy else sibling_rows(draft.probs, draft.tokens.tolist(), parents, draft.siblings)
    if sampling.reads_prefix:
        logits = rows.all()  # (n + 1, V)
        if sampling.greedy:
            return verify_tree_greedy(pipeline.argmax(logits, prefixes(row, checked)).tolist().__getitem__,
                                      draft.tokens, parents)
        p = pipeline.probabilities(logits, prefixes(row, checked))  # (n + 1, V)
        return verify_tree(p.__getitem__, draft.tokens, parents, q, row.generator)
    if sampling.greedy:
        if argmax is not None:
            return verify_tree_greedy(argmax.__getitem__, draft.tokens, parents)
        if sampling.plain:
            return verify_tree_greedy(rows.argmax, draft.tokens, parents)
        return verify_tree_greedy(lambda r: int(pipeline.argmax(rows.row(r)[None], None)), draft.tokens, parents)
    return verify_tree(lambda r: pipeline.probabilities(rows.row(r)[None], None)[0], draft.tokens, parents, q,
                       row.generator)


def _read(run: Run, drafts: dict[int, Checked], pending: dict[int, Any]) -> dict[int, tuple[Verdict | None, int]]:
    """Every slot's verdict, with the numbers accepted, the stops and the faults read in one transfer."""
    device = run.lm.device
    zero = torch.zeros((), dtype=torch.long, device=device)
    columns = []
    for item in pending.values():
        if isinstance(item, Verdict):
            num = torch.tensor(item.num_accepted, device=device)
            columns.append(torch.stack([num, first_stop(item.tokens.to(device), num, run.plan.stop), zero]))
        else:
            num, out, _, _, faults = item
            flag = zero if faults is None else faults.long()
            columns.append(torch.stack([num, first_stop(out, num, run.plan.stop), flag]))
    read = torch.stack(columns).tolist() if columns else []  # (slots, 3): the step's one transfer
    decided: dict[int, tuple[Verdict | None, int]] = {slot: (None, 0) for slot, _ in run.live()}
    for (slot, item), (accepted, stop_at, broken) in zip(pending.items(), read):
        if isinstance(item, Verdict):
            decided[slot] = (item, stop_at)
            continue
        if broken:
            index = run.slots[slot]
            assert index is not None
            name_fault(run, index, drafts[index].draft)
        _, out, acceptance, uniforms, _ = item
        decided[slot] = (Verdict(out[: accepted + 1], accepted, acceptance, uniforms), stop_at)
    return decided


def prefixes(row: Row, checked: Checked) -> Prefixes | None:
    """Each verify row's prefix (the committed ids, then the row's draft path), when the settings
    read it; None otherwise."""
    if not row.pipeline.reads_prefix:
        return None
    return Prefixes.of_verify(row.committed, row.prompt_length, checked.draft.tokens, checked.parents)


def first_stop(out: torch.Tensor, num_accepted: torch.Tensor, stop: torch.Tensor | None) -> torch.Tensor:
    """The index of the first stop id in out[: num_accepted + 1], or len(out) when there is none (0-d, on
    the device: the loop reads it back with the number accepted)."""
    if stop is None:
        return torch.full((), out.shape[0], dtype=torch.long, device=out.device)
    index = torch.arange(out.shape[0], device=out.device)  # (n + 1,)
    hit = torch.isin(out, stop) & (index <= num_accepted.to(out.device))
    return torch.where(hit, index, out.shape[0]).min()
