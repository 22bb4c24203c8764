"""Token-wise and block verification of the same chain draft with the same uniform draws, for
learners: what each rule would keep, and each position's test.

Token-wise verification (Leviathan et al. 2023) accepts draft token i while u_i < a_i =
min(1, p_i(d_i) / q_i(d_i)) and stops at the first failure. Block verification (Sun, Mendlovic,
Leviathan, Aharoni, Beirami, Ro and Suresh, ICLR 2025, "Block Verification Accelerates
Speculative Decoding"; `specdec.verifier.block`) tests each prefix i on its own, u_i < h_i, and
keeps the longest that passed: it can keep a later prefix after an earlier token's test failed.
On a single draw either rule may keep more; on average block never keeps fewer.

`ComparingTrace` is a `Trace` that also records this comparison for every sampled chain step
(the `specdec play` page shows it beside the step); `RuleExpectations` records what each rule
keeps on average from every step's draft (`examples/rule_gain.py` reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from specdec.teaching.trace import CacheLengths, Trace
from specdec.types import Draft, Verdict
from specdec.verifier.block import block_tests, kept_prefix
from specdec.verifier.chain import acceptance_probabilities
from specdec.verifier.expected import expected_accepted
from specdec.verifier.siblings import sibling_rows

if TYPE_CHECKING:
    from specdec.processing import Pipeline, Prefixes

__all__ = ["ComparingTrace", "RuleComparison", "RuleExpectations", "compare_rules"]


@dataclass(frozen=True)
class RuleComparison:
    """Both rules on one draft of k tokens; every tuple has k entries, entry i for draft token i + 1."""

    acceptance: tuple[float, ...]  # token-wise: a_i = min(1, p_i(d_i) / q_i(d_i))
    block_h: tuple[float, ...]  # block: h_i, the probability of keeping the first i tokens if no longer prefix is kept
    uniforms: tuple[float, ...]  # u_i, read by both rules: u_i < a_i (token-wise), u_i < h_i (block)
    token_kept: int  # the longest prefix whose every token passed u_i < a_i
    block_kept: int  # the longest prefix i whose own test u_i < h_i passed (0 if none)


def compare_rules(p: torch.Tensor, tokens: torch.Tensor, q: torch.Tensor | None,
                  uniforms: torch.Tensor) -> RuleComparison:
    """Token-wise and block verification of `tokens` with the same `uniforms`.

    p: [k + 1, V] the target's processed distributions; tokens: [k]; q: [k, V] the draft's (rows
    normalised here, as the verifier does) or None (one-hot at the draft tokens); uniforms: [k]."""
    k = tokens.shape[0]
    if p.shape[0] != k + 1 or uniforms.shape != (k,):
        raise ValueError(f"compare_rules needs p [k + 1, V] and uniforms [k] for a draft of k = {k} tokens; "
                         f"got p {tuple(p.shape)} and uniforms {tuple(uniforms.shape)}")
    if q is None:
        q = torch.zeros(k, p.shape[-1], dtype=p.dtype, device=p.device).scatter_(-1, tokens.unsqueeze(-1), 1.0)
    elif q.shape != (k, p.shape[-1]):
        raise ValueError(f"compare_rules needs q [k, V] = [{k}, {p.shape[-1]}] or None; got {tuple(q.shape)}")
    else:
        q = q.to(p.dtype)
        q = q / q.sum(dim=-1, keepdim=True)
    uniforms = uniforms.to(p.dtype)
    accept = acceptance_probabilities(p[:k], q, tokens)  # (k,)
    h, _ = block_tests(p, q, tokens)  # (k + 1,): h_0 = 1, then h_1 .. h_k
    return RuleComparison(acceptance=tuple(accept.tolist()), block_h=tuple(h[1:].tolist()),
                          uniforms=tuple(uniforms.tolist()), token_kept=int((uniforms < accept).cumprod(0).sum()),
                          block_kept=int(kept_prefix(h, uniforms)))


@dataclass
class ComparingTrace(Trace):
    """A `Trace` that also keeps, for each step, `compare_rules` on its draft with the uniforms the
    step drew: None for a greedy step, a tree, or an empty draft."""

    comparisons: list[RuleComparison | None] = field(default_factory=list)

    def record(self, draft: Draft, logits: torch.Tensor, pipeline: Pipeline, prefixes: Prefixes | None,
               verdict: Verdict, emitted: int, draft_seconds: float, verify_seconds: float,
               parents: list[int] | None = None, caches: CacheLengths | None = None) -> None:
        super().record(draft, logits, pipeline, prefixes, verdict, emitted, draft_seconds, verify_seconds,
                       parents, caches)
        comparison = None
        if parents is None and verdict.uniforms is not None and draft.tokens.shape[0] > 0:
            p = pipeline.probabilities(logits, prefixes)  # (k + 1, V): the rows the verifier read
            comparison = compare_rules(p, draft.tokens, draft.probs, verdict.uniforms)
        # one entry per step, aligned with `steps` even if the loop restarted them
        self.comparisons = self.comparisons[: len(self.steps) - 1] + [comparison]


@dataclass
class RuleExpectations(Trace):
    """A `Trace` that also keeps, for each sampled step with a draft, how many draft tokens each
    rule keeps on average from that very draft (`specdec.verifier.expected_accepted`): a chain
    under "token" and "block", a tree under "token" (the sibling rule) and "traversal". Rules
    compared this way see the same drafts and no sampling noise of their own."""

    expectations: list[dict[str, float]] = field(default_factory=list)

    def record(self, draft: Draft, logits: torch.Tensor, pipeline: Pipeline, prefixes: Prefixes | None,
               verdict: Verdict, emitted: int, draft_seconds: float, verify_seconds: float,
               parents: list[int] | None = None, caches: CacheLengths | None = None) -> None:
        super().record(draft, logits, pipeline, prefixes, verdict, emitted, draft_seconds, verify_seconds,
                       parents, caches)
        if pipeline.sampling.greedy or draft.tokens.shape[0] == 0:
            return
        p = pipeline.probabilities(logits, prefixes)  # (n + 1, V): the rows the verifier read
        if parents is None:
            self.expectations.append({rule: expected_accepted(rule, p, draft.tokens, None, draft.probs)
                                      for rule in ("token", "block")})
            return
        q = sibling_rows(draft.probs, draft.tokens.tolist(), parents, draft.siblings)
        self.expectations.append({rule: expected_accepted(rule, p, draft.tokens, parents, q)
                                  for rule in ("token", "traversal")})
