"""The decode loop's agreement across ranks (`specdec.distributed.ranks`): a step's draft and its verdict,
each packed into one fixed-length integer tensor so that a single broadcast carries it.

A draft packs as [n, tree, m, tokens (D), parents (D), extra ids (E), extra offsets (E),
extra visibility (E * E)], D the engine's node budget and E its extra rows; a verdict as
[accepted, stop, tokens (D + 1), path (D)]. Probabilities never travel: only the leader's
verdict counts, and a rank whose own draft was the leader's computes the same verdict.
"""

from __future__ import annotations

import torch

from specdec.distributed.ranks import Ranks
from specdec.types import Draft, Engine, ExtraRows, Verdict

__all__ = ["Agreement", "agree_drafts", "agree_verdicts"]


class Agreement:
    """How the processes holding one target take each step's decisions together: the decode loop
    passes its drafts and its verdicts through `drafts` and `verdicts` every step. Without ranks
    (`ranks` None) both return what they are given; under ranks every rank takes the leader's,
    so that every rank feeds the same draft and commits the same tokens whatever its own
    drafter or generator did (the leader decides, the others receive)."""

    def __init__(self, ranks: Ranks | None, engine: Engine) -> None:
        self.ranks, self.engine = ranks, engine

    def drafts(self, drafts: list[tuple[Draft, list[int] | None]], step: int
               ) -> list[tuple[Draft, list[int] | None, bool]]:
        """Each row's draft and parents, in the same row order on every rank, and whether this
        rank's own were the leader's (probabilities are kept only then: a rank whose draft was
        not the leader's cannot decide that row's verdict)."""
        if self.ranks is None or not drafts:
            return [(draft, parents, True) for draft, parents in drafts]
        return agree_drafts(self.ranks, drafts, self.engine, f"drafts of step {step}")

    def verdicts(self, verdicts: list[tuple[Verdict | None, int]], step: int, device: torch.device
                 ) -> list[tuple[Verdict, int]]:
        """Each row's verdict and stop index (None: this rank did not decide it), the leader's."""
        if self.ranks is None:
            assert all(verdict is not None for verdict, _ in verdicts), "a row without a verdict, and no leader"
            return verdicts  # type: ignore[return-value]
        return agree_verdicts(self.ranks, verdicts, self.engine.draft_nodes, f"verdicts of step {step}", device)


def agree_drafts(ranks: Ranks, drafts: list[tuple[Draft, list[int] | None]], engine: Engine, what: str
                 ) -> list[tuple[Draft, list[int] | None, bool]]:
    """The leader's draft and parents of every row of a step at once (one broadcast), rows in the
    same order on every rank, and whether this rank's own were the same."""
    nodes, extra_rows = engine.draft_nodes, engine.extra_rows
    own = torch.stack([_pack_draft(draft, parents, nodes, extra_rows) for draft, parents in drafts])  # (rows, L)
    agreed = ranks.agree(own.reshape(-1), what).reshape(own.shape)
    out = []
    for (draft, parents), mine, theirs in zip(drafts, own, agreed):
        out.append((draft, parents, True) if torch.equal(mine, theirs) else
                   _unpack_draft(theirs, nodes, extra_rows, draft.tokens.device))
    return out


def agree_verdicts(ranks: Ranks, verdicts: list[tuple[Verdict | None, int]], nodes: int, what: str,
                   device: torch.device) -> list[tuple[Verdict, int]]:
    """The leader's verdict and stop index of every row of a step at once (one broadcast), its
    tokens on `device` (a verdict None: this rank did not decide, its draft was not the leader's)."""
    own = torch.stack([_pack_verdict(verdict, stop_at, nodes, device) for verdict, stop_at in verdicts])
    agreed = ranks.agree(own.reshape(-1), what).reshape(own.shape).to(device)
    out = []
    for (verdict, stop_at), mine, theirs in zip(verdicts, own, agreed):
        if verdict is not None and torch.equal(mine, theirs):
            out.append((verdict, stop_at))
            continue
        accepted, stop = int(theirs[0]), int(theirs[1])
        path = tuple(theirs[3 + nodes : 3 + nodes + accepted].tolist())
        out.append((Verdict(theirs[2 : 3 + accepted].clone(), accepted, path=path), stop))
    return out


def _pack_draft(draft: Draft, parents: list[int] | None, nodes: int, extra_rows: int) -> torch.Tensor:
    device = draft.tokens.device
    n = draft.tokens.shape[0]
    payload = torch.zeros(3 + 2 * nodes + 2 * extra_rows + extra_rows * extra_rows, dtype=torch.long, device=device)
    payload[0], payload[1] = n, int(parents is not None)
    payload[3 : 3 + n] = draft.tokens
    if parents is not None:
        payload[3 + nodes : 3 + nodes + n] = torch.tensor(parents, dtype=torch.long, device=device)
    extra = draft.extra
    if extra is not None:
        m = extra.tokens.shape[0]
        start = 3 + 2 * nodes
        payload[2] = m
        payload[start : start + m] = extra.tokens
        payload[start + extra_rows : start + extra_rows + m] = extra.positions
        grid = torch.zeros(extra_rows, extra_rows, dtype=torch.long, device=device)
        grid[:m, :m] = extra.visible.long()
        payload[start + 2 * extra_rows :] = grid.reshape(-1)
    return payload


def _unpack_draft(payload: torch.Tensor, nodes: int, extra_rows: int, device: torch.device
                  ) -> tuple[Draft, list[int] | None, bool]:
    payload = payload.to(device)
    n, tree, m = (int(v) for v in payload[:3].tolist())
    tokens = payload[3 : 3 + n].clone()
    parents = payload[3 + nodes : 3 + nodes + n].tolist() if tree else None
    extra = None
    if m:
        start = 3 + 2 * nodes
        grid = payload[start + 2 * extra_rows :].reshape(extra_rows, extra_rows)
        extra = ExtraRows(payload[start : start + m].clone(), payload[start + extra_rows : start + extra_rows + m].clone(),
                          grid[:m, :m].bool())
    as_tensor = None if parents is None else torch.tensor(parents, dtype=torch.long, device=device)
    return Draft(tokens, None, as_tensor, extra), parents, False


def _pack_verdict(verdict: Verdict | None, stop_at: int, nodes: int, device: torch.device) -> torch.Tensor:
    payload = torch.full((3 + 2 * nodes,), -1, dtype=torch.long, device=device)
    if verdict is None:
        return payload
    accepted = verdict.num_accepted
    payload[0], payload[1] = accepted, stop_at
    payload[2 : 3 + accepted] = verdict.tokens[: accepted + 1].to(device)
    if accepted:
        payload[3 + nodes : 3 + nodes + accepted] = torch.tensor(verdict.accepted_nodes, dtype=torch.long,
                                                                 device=device)
    return payload
