"""The verify of a batch step: every row's draft laid out on the same R rows of one batched
forward (chains padded to k + 1, trees to the node budget and the extra rows, a chain as a
chain-shaped tree when another row drafted a tree: `specdec.trees.verify_layout`), then each row's
verdict from that forward's logits with the batch-1 verifier functions."""

from __future__ import annotations

from typing import Any

import torch

from specdec.decoding.batch_state import BatchRun, Checked, Row, live_rows
from specdec.processing import Prefixes
from specdec.sampling import greedy_ids
from specdec.trees import chain_parents, verify_layout
from specdec.types import Draft, Verdict
from specdec.verifier import (DraftError, chain_rule, greedy_verdicts, sibling_rows, tree_rule, validate_draft,
                              verify_tree_greedy)

__all__ = ["lay_out", "row_verdicts"]


def lay_out(run: BatchRun, drafts: dict[int, Checked], width: int, rows: int
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


def row_verdicts(run: BatchRun, drafts: dict[int, Checked], logits: torch.Tensor, ids: torch.Tensor, tree: bool
              ) -> dict[int, Verdict]:
    """Each live slot's verdict. Greedy chains: all at once, one read of the numbers accepted,
    the argmax rows and the faults; otherwise row by row with the batch-1 verifier functions.
    Each row's p comes from its own pipeline and, when the settings read it, its own prefix.
    Under ranks, a sampled row whose draft was not this rank's own has none (the leader's comes)."""
    live = live_rows(run)
    if run.sampling.greedy:
        argmax = _greedy_rows(run, drafts, logits)  # (S, R)
    if run.sampling.greedy and not tree:
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
    host = argmax.tolist() if run.sampling.greedy else None  # (S, R)
    out = {}
    for slot, row in live:
        checked = drafts.get(row.index)
        draft_ = Draft(ids[slot, :0]) if checked is None else checked.draft
        parents = None if checked is None else checked.parents
        pipeline = row.pipeline
        assert pipeline is not None
        if host is not None:
            argmax_row = host[slot]
            out[slot] = verify_tree_greedy(argmax_row.__getitem__, draft_.tokens,
                                           parents if parents is not None else chain_parents(draft_.tokens.shape[0]))
        elif checked is not None and not checked.own:
            continue  # the leader decides a row whose draft this rank did not draft
        elif parents is not None:
            n = draft_.tokens.shape[0]
            verify_tree = tree_rule(run.verify_rule)
            q = sibling_rows(draft_.probs, draft_.tokens.tolist(), parents, draft_.siblings)
            if run.sampling.reads_prefix:  # every node's p from its own path, all at once
                p = pipeline.probabilities(logits[slot, : n + 1], _prefixes(row, draft_.tokens, parents))
                out[slot] = verify_tree(p.__getitem__, draft_.tokens, parents, q, row.generator)
            else:
                out[slot] = verify_tree(lambda r, s=slot: pipeline.probabilities(logits[s, r][None], None)[0],
                                        draft_.tokens, parents, q, row.generator)
        else:
            n = draft_.tokens.shape[0]
            p = pipeline.probabilities(logits[slot, : n + 1], _prefixes(row, draft_.tokens, None))  # (n + 1, V)
            num, tokens, acceptance, uniforms = chain_rule(run.verify_rule)(p, draft_.tokens, draft_.probs,
                                                                            row.generator)
            faults = checked.faults if checked is not None and checked.faults is not None else \
                torch.zeros((), dtype=torch.bool, device=p.device)
            accepted, broken = torch.stack([num, faults.long()]).tolist()
            if broken:
                _name_fault(run, row.index, draft_)
            out[slot] = Verdict(tokens[: accepted + 1], accepted, acceptance, uniforms)
    return out


def _greedy_rows(run: BatchRun, drafts: dict[int, Checked], logits: torch.Tensor) -> torch.Tensor:
    """The greedy id of every verify row of every slot [S, R]: the argmax of the logits, after the
    bias and the bans, and, where the settings read the prefix, of each live row's processed
    scores from its own prefixes."""
    if run.sampling.plain:
        return logits.argmax(dim=-1)
    if not run.sampling.reads_prefix:
        return greedy_ids(logits, run.sampling)
    argmax = logits.argmax(dim=-1)  # (S, R); the live rows' processed below
    for slot, row in live_rows(run):
        checked = drafts.get(row.index)
        tokens = row.tokens[:0] if checked is None else checked.draft.tokens
        parents = None if checked is None else checked.parents
        n = tokens.shape[0]
        assert row.pipeline is not None
        argmax[slot, : n + 1] = row.pipeline.argmax(logits[slot, : n + 1], _prefixes(row, tokens, parents))
    return argmax


def _prefixes(row: Row, tokens: torch.Tensor, parents: list[int] | None) -> Prefixes | None:
    """The prefix of each verify row of `row`'s draft (a chain's or a tree's), when the settings read it."""
    assert row.pipeline is not None
    if not row.pipeline.reads_prefix:
        return None
    return Prefixes.of_verify(row.tokens[: row.length], row.prompt_length, tokens, parents)


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
