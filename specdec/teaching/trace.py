"""A record of every decode step, for learners: which tokens were drafted, what the target
thought of each (p), what the drafter claimed (q), the acceptance probability min(1, p/q), the
uniform draw that decided, where the correction or bonus came from, the time each step's
drafting and verifying took, the whole draft (a tree with its parents) and how the target's and
the drafter's caches grew and rolled back. `specdec.generate(..., trace=Trace())` fills one.

At temperature 0 the verifier compares with the target's argmax and draws nothing: `p` is then
the target's probability at temperature 1 (for reading), `accept` is 1 or 0 and `uniform` None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from specdec.trees import children
from specdec.types import Draft, Verdict

if TYPE_CHECKING:
    from specdec.processing import Pipeline, Prefixes

__all__ = ["CacheLengths", "Trace", "TraceStep", "TraceToken"]


@dataclass(frozen=True)
class TraceToken:
    """One token of a step: `kind` is accepted, rejected (a drafted token the verifier refused),
    correction (drawn after a rejection) or bonus (drawn after a full acceptance)."""

    token: int
    kind: str
    p: float | None = None  # the target's probability of a drafted token
    q: float | None = None  # the drafter's (1.0 for a deterministic draft)
    accept: float | None = None  # min(1, p / q)
    uniform: float | None = None  # the draw compared with `accept` (None at temperature 0)
    node: int | None = None  # the draft node a drafted token is (its index in TraceStep.drafted)


@dataclass(frozen=True)
class CacheLengths:
    """Positions held by the target's KV cache, and the drafter's (None for a drafter without a
    cache, or one that does not report its `cache_length`), at three moments of a step: when the
    drafter is asked, after the verify forward (the target: the last committed id, the draft and
    its extra rows, not the padding of a fixed-shape forward) or the propose (the drafter), and
    after the commit has rolled both back to the committed tokens."""

    target: tuple[int, int, int]
    drafter: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class TraceStep:
    """One target forward: its tokens in order, and the seconds spent drafting and verifying."""

    tokens: tuple[TraceToken, ...]
    draft_seconds: float
    verify_seconds: float
    drafted: tuple[int, ...] = ()  # every drafted token (a tree's nodes in order)
    parents: tuple[int, ...] | None = None  # a tree's parent of each node (-1: the root); None for a chain
    caches: CacheLengths | None = None
    draft_forwards: int | None = None  # drafter forwards that made the draft, where the drafter says (a block: 1)
    note: str | None = None  # why the drafter drafted what it did, where it says (`Draft.note`)

    @property
    def emitted(self) -> list[int]:
        return [t.token for t in self.tokens if t.kind != "rejected"]


@dataclass
class Trace:
    """Filled by `generate`: the prompt ids and one TraceStep per target forward after the prefill."""

    prompt: list[int] = field(default_factory=list)
    steps: list[TraceStep] = field(default_factory=list)
    prefill_seconds: float = 0.0
    verify_rule: str = "token"  # the rule that judged the steps (`specdec.verifier.rules`), set by generate

    def record(self, draft: Draft, logits: torch.Tensor, pipeline: Pipeline, prefixes: Prefixes | None,
               verdict: Verdict, emitted: int, draft_seconds: float, verify_seconds: float,
               parents: list[int] | None = None, caches: CacheLengths | None = None) -> None:
        """Add one step; `emitted` is how many of the verdict's tokens the loop kept (EOS, budget).
        `logits` [n + 1, V] are the verify rows' and `prefixes` their prefixes (None when the
        settings read none): p is shown as the verifier computed it (greedy: the softmax of the
        processed scores, whose argmax it took).

        For a tree (`parents` given) the step lists, level by level, each candidate the verifier
        tried (the rejected siblings, then the accepted one), with p read at its parent's row.
        """
        n = int(draft.tokens.shape[0])
        if pipeline.sampling.greedy:
            shown = pipeline.scores(logits, prefixes).float().softmax(-1)  # (n+1, V)
        else:
            shown = pipeline.probabilities(logits, prefixes)
        drafted = draft.tokens.tolist()
        tried = _tried(parents, verdict) if parents is not None else [
            (i, i, "accepted" if i < verdict.num_accepted else "rejected")
            for i in range(min(n, verdict.num_accepted + 1))]
        tokens: list[TraceToken] = []
        # a rule that tests nodes off the walk (traversal) says which node each test was
        entry = {node: j for j, node in enumerate(verdict.tested)} if verdict.tested is not None else None
        for j, (node, row, kind) in enumerate(tried):
            p = float(shown[row, drafted[node]])
            q = 1.0 if draft.probs is None else float(draft.probs[node, drafted[node]])
            at = j if entry is None else entry.get(node)
            accept = None if verdict.acceptance is None or at is None else float(verdict.acceptance[at])
            uniform = None if verdict.uniforms is None or at is None else float(verdict.uniforms[at])
            tokens.append(TraceToken(drafted[node], kind, p, q, accept, uniform, node))
        last = int(verdict.tokens[-1])
        final_row = verdict.accepted_nodes[-1] + 1 if verdict.num_accepted else 0
        if parents is None:
            final_row = verdict.num_accepted
            bonus = verdict.num_accepted == n
        else:
            bonus = not children(parents)[final_row]
        tokens.append(TraceToken(last, "bonus" if bonus else "correction", float(shown[final_row, last])))
        kept: list[TraceToken] = []
        for token in tokens:  # drop what the loop did not emit (past EOS or the budget)
            if token.kind == "rejected" or sum(t.kind != "rejected" for t in kept) < emitted:
                kept.append(token)
        self.steps.append(TraceStep(tuple(kept), draft_seconds, verify_seconds, tuple(drafted),
                                    None if parents is None else tuple(parents), caches, draft.forwards, draft.note))



def _tried(parents: list[int], verdict: Verdict) -> list[tuple[int, int, str]]:
    """(node, row of p it was checked against, kind) for each tree node the verifier tried, in order:
    at each accepted row its children up to the accepted one; at the last row all of them."""
    kids = children(parents)
    path = verdict.accepted_nodes
    out: list[tuple[int, int, str]] = []
    for level, row in enumerate([0] + [node + 1 for node in path]):
        for child in kids[row]:
            chosen = level < len(path) and child == path[level]
            out.append((child, row, "accepted" if chosen else "rejected"))
            if chosen:
                break
    return out
