"""The decode loop: prefill, then draft -> verify -> commit -> record until done.

Each part is one function that owns one thing: `draft` the drafter's proposal and its checks,
`verify` the target's one forward and the verdict, `commit` the rollback of the target and
the drafter to the committed sequence, `record` the counters and the trace. Plain decoding
(no drafter) is the same loop with empty drafts, so both share one sampling pipeline and one
code path for EOS, budgets and statistics. Eager and compiled decoding share it too: they
differ only in whether the fixed-shape steps underneath run compiled (`specdec.runtime.engine`).

Shapes stay fixed: a chain's verify is padded to k + 1 rows (one row when a drafter reading no
hidden states drafted nothing), a tree's to its node budget, so a run compiles a few graphs
whatever its drafts. A chain step reads back from the device once: the number accepted and
where a stop id fell.

A draft may carry extra rows (`Draft.extra`, e.g. lookahead decoding's Jacobi rows): they ride
the same tree forward after the tree's rows, padded to the drafter's declared `extra_rows()`
(a chain goes as a chain-shaped tree), their logits go back to the drafter in
`ctx.extra_logits`, and `keep_path` drops them from the cache with the rejected nodes.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from specdec.decoding.counters import Counters
from specdec.decoding.drafts import call_drafter, check_tree_size, hidden_layers
from specdec.distributed.agreement import agree_draft, agree_verdict
from specdec.protocols import DraftContext, Drafter
from specdec.runtime.target import CausalLM
from specdec.runtime.tree_logits import TreeLogits
from specdec.processing import Prefixes
from specdec.processing.pipeline import Pipeline
from specdec.teaching.trace import CacheLengths, Trace
from specdec.trees import chain_parents, depths, first_path
from specdec.types import Draft, Engine, Generation, Sampling, Verdict
from specdec.verifier import (DEFAULT_RULE, DraftError, chain_rule, draft_faults, greedy_verdict, sibling_rows, tree_rule,
                              validate_draft, verify_tree_greedy)

__all__ = ["Run", "decode", "first_stop"]


@dataclass
class Run:
    """The state of one generation. `tokens` [prompt + max_new_tokens + verify rows] holds the
    committed ids in [0, length), then scratch; the target's cache holds all of them but the last."""

    lm: CausalLM
    drafter: Drafter | None
    name: str
    k: int
    max_new_tokens: int
    sampling: Sampling
    generator: torch.Generator
    stop: torch.Tensor | None  # [S] stop ids on the model's device
    engine: Engine
    tokens: torch.Tensor
    prompt_length: int
    trace: Trace | None = None
    length: int = 0
    produced: int = 0
    ctx: DraftContext | None = None
    counters: Counters = field(default_factory=lambda: Counters(0))
    warned: bool = False  # the tree fallback's warning, once per run
    warned_extra: bool = False  # the warning that extra rows are dropped, once per run
    layers: tuple[int, ...] = ()  # the target layers whose hidden states the drafter reads (`hidden_layers`)
    pipeline: Pipeline | None = None  # the sampling pipeline (`specdec.processing`); built at prefill when None
    verify_rule: str = DEFAULT_RULE  # the verification rule (`specdec.verifier.rules`)
    tokenizer: Any = None  # the target's, when the caller gave it (`DraftContext.tokenizer`)


@dataclass(frozen=True)
class Proposal:
    """The step's checked draft. `parents`: None for a chain; `nodes`: the draft node behind each
    chain position after a tree was cut to its first path; `proposed`: the drafter was asked."""

    draft: Draft
    parents: list[int] | None = None
    nodes: list[int] | None = None
    proposed: bool = False
    seconds: float = 0.0
    faults: torch.Tensor | None = None  # 0-d: a chain's ids or probs break the contract (read with the verdict)
    own: bool = True  # under ranks: this rank's draft is the leader's, so this rank can decide its verdict
    drafter_lengths: tuple[int, int] | None = None  # traced: the drafter's cache before and after its propose


@dataclass(frozen=True)
class Block:
    """What one verify decided: the verdict, how many of its tokens are emitted (EOS and the
    budget cut the block), whether a stop id ended it, and the target's rows for the drafter."""

    verdict: Verdict
    emitted: int
    stopped: bool
    hidden: torch.Tensor | None
    shown: Any  # the logits the trace reads: [n + 1, V] for a chain, the TreeLogits of a tree
    seconds: float
    extra_logits: torch.Tensor | None = None  # [m, V] the logits of the draft's extra rows
    lengths: tuple[int, int] = (0, 0)  # the target's cache before the verify forward, and with its rows
    # (the last committed id, the draft and its extra rows; the padding of a fixed shape not counted)


def decode(run: Run) -> Generation:
    """Generate until the budget is spent or a stop id is emitted."""
    start = time.perf_counter()
    prefill(run)
    prefill_seconds = time.perf_counter() - start
    if run.trace is not None:
        run.trace.prompt, run.trace.steps = run.tokens[: run.prompt_length].tolist(), []
        run.trace.prefill_seconds = prefill_seconds
    while run.produced < run.max_new_tokens:
        proposal = draft(run)
        block = verify(run, proposal)
        commit_seconds = commit(run, proposal, block)
        record(run, proposal, block, commit_seconds)
        if block.stopped:
            break
    if run.drafter is not None and hasattr(run.drafter, "finish"):
        _call(run, "finish", run.ctx)
    new = run.tokens[run.prompt_length : run.length].tolist()
    stats = run.counters.stats(len(new), prefill_seconds, time.perf_counter() - start)
    return Generation(tokens=new, stats=stats)


def prefill(run: Run) -> None:
    """Size and fill the target's cache with the prompt but its last id; then the drafter's prefill."""
    lm = run.lm
    lm.reset(run.engine.cache_capacity(static=lm.static_eagerly), compile=run.engine.compile)
    run.layers = hidden_layers(run.drafter, run.name, lm)
    width = len(run.layers) * lm.hidden_size
    hidden = torch.empty(0, width, dtype=lm.dtype, device=lm.device) if run.layers else None
    run.length = run.prompt_length
    if run.pipeline is None:
        run.pipeline = Pipeline(run.sampling, lm.vocab_size, run.prompt_length)
    if run.length > 1:  # eager: the prompt's length varies from call to call
        _, hidden = lm.forward(run.tokens[: run.length - 1], keep=1, hidden=run.layers)
    run.counters = Counters(run.k)
    run.ctx = _context(run, hidden, ())
    if run.drafter is not None and hasattr(run.drafter, "prefill"):
        _call(run, "prefill", run.ctx)


def draft(run: Run) -> Proposal:
    """Ask the drafter for at most min(k, budget - 1) tokens and check what it returns."""
    budget = run.max_new_tokens - run.produced
    if run.drafter is None or budget <= 1 or run.k == 0:
        return Proposal(Draft(run.tokens[:0]))
    tick = time.perf_counter()
    k = min(run.k, budget - 1)
    before = _drafter_length(run) if run.trace is not None else None
    proposed = _call(run, "propose", run.ctx, k)
    after = _drafter_length(run) if before is not None else None
    parents = validate_draft(proposed, k, run.lm.vocab_size, run.lm.device, run.name, values=False,
                             extra_rows=run.engine.extra_rows)
    if proposed.extra is not None:
        proposed, parents = _with_extra(run, proposed, k, parents)
    if parents is not None:
        _check_tree(run, proposed, k, parents)
    if run.lm.cache_length != run.length - 1:
        raise DraftError(f"drafter {run.name!r} changed the target's KV cache ({run.length - 1} -> "
                         f"{run.lm.cache_length} positions); drafters must not run ctx.target.forward")
    nodes = None
    if parents is not None and run.lm.tree_obstacle is not None:
        proposed, nodes = _first_path(run, proposed, parents)
        parents = None
    faults = draft_faults(proposed, run.lm.vocab_size) if parents is None and proposed.tokens.numel() else None
    own = True
    if run.lm.ranks is not None:  # every rank feeds the leader's draft (`specdec.distributed.ranks`)
        proposed, parents, own = agree_draft(run.lm.ranks, proposed, parents, run.engine, run.counters.steps)
        nodes, faults = (nodes, faults) if own else (None, None)
    _synchronize(run.lm.device)
    lengths = (before, after) if before is not None and after is not None else None
    return Proposal(proposed, parents, nodes, True, time.perf_counter() - tick, faults, own, lengths)


def verify(run: Run, proposal: Proposal) -> Block:
    """One target forward over the last committed id and the draft, and the verdict on it."""
    tick = time.perf_counter()
    n = proposal.draft.tokens.shape[0]
    before = run.lm.cache_length
    shown: Any
    # scratch beyond the committed length; clamped so that a broken draft never indexes past the
    # embedding (its fault is read back with the verdict, and nothing of it is committed)
    drafted = proposal.draft.tokens.clamp(0, run.lm.vocab_size - 1)  # (n,)
    run.tokens[run.length : run.length + n] = drafted
    extra_logits = None
    if proposal.parents is None:
        verdict, stop_at, hidden, shown = _verify_chain(run, proposal, drafted)  # shown: logits [n + 1, V]
    else:
        extra = proposal.draft.extra  # padded to the declared count: one shape for every draft
        tree = run.lm.forward_tree(run.tokens[run.length - 1 : run.length + n], proposal.parents,
                                   rows=run.engine.tree_rows(n), hidden=run.layers,
                                   extra=None if extra is None else extra.padded(run.engine.extra_rows))
        verdict = _verify_tree(run, tree, proposal.draft, proposal.parents) if proposal.own else None
        stop_at = int(first_stop(verdict.tokens, torch.tensor(verdict.num_accepted), run.stop)) \
            if verdict is not None else 0
        hidden, shown = tree.states, tree
        extra_logits = None if extra is None or tree.extra is None else tree.extra[: extra.tokens.shape[0]]
    if run.lm.ranks is not None:  # every rank commits the leader's verdict (`specdec.distributed.ranks`)
        verdict, stop_at = agree_verdict(run.lm.ranks, verdict, stop_at, run.engine.draft_nodes, run.counters.steps,
                                         run.lm.device)
    assert verdict is not None
    emitted = min(verdict.num_accepted + 1, stop_at + 1, run.max_new_tokens - run.produced)
    rows = n + 1 + (0 if proposal.draft.extra is None else proposal.draft.extra.tokens.shape[0])
    return Block(verdict, emitted, stop_at < emitted, hidden, shown, time.perf_counter() - tick, extra_logits,
                 (before, before + rows))


def _verify_chain(run: Run, proposal: Proposal, drafted: torch.Tensor
                  ) -> tuple[Verdict | None, int, torch.Tensor | None, torch.Tensor]:
    """The chain's verify forward, padded to k + 1 rows (one row for an empty draft of a drafter
    that reads no hidden states: plain decoding, n-gram without a match), and its verdict, read
    back in one transfer with the first stop id and the draft's faults (no verdict on a rank whose
    draft was not the leader's)."""
    lm, n = run.lm, drafted.shape[0]
    # one shape for every draft, one for none; a drafter reading hidden states drafts nothing only
    # rarely (at the budget's end, or before it has a state to draft from), which takes the k + 1-row
    # shape rather than a graph of its own
    rows = run.engine.max_draft + 1 if (n or run.layers) and lm.static else n + 1
    ids = run.tokens[run.length - 1 : run.length - 1 + rows].clone()  # the rows past the draft are padding
    logits, hidden = lm.forward(ids, keep=rows, hidden=run.layers, rows=rows)
    logits = logits[: n + 1]  # (n + 1, V)
    if not proposal.own:
        return None, 0, hidden, logits
    uniforms = None
    prefixes = draft_prefixes(run, drafted, None)
    assert run.pipeline is not None
    if run.sampling.greedy:
        argmax = logits.argmax(dim=-1) if run.sampling.plain else run.pipeline.argmax(logits, prefixes)
        num, out, acceptance = greedy_verdict(argmax, drafted)
    else:
        num, out, acceptance, uniforms = chain_rule(run.verify_rule)(run.pipeline.probabilities(logits, prefixes),
                                                                     drafted, proposal.draft.probs, run.generator)
    faults = proposal.faults if proposal.faults is not None else torch.zeros((), dtype=torch.bool, device=lm.device)
    accepted, stop_at, broken = torch.stack([num, first_stop(out, num, run.stop), faults.long()]).tolist()
    if broken:
        validate_draft(proposal.draft, run.k, lm.vocab_size, lm.device, run.name)  # names the fault
        raise DraftError(f"drafter {run.name!r} returned a broken draft")
    return Verdict(out[: accepted + 1], accepted, acceptance, uniforms), stop_at, hidden, logits


def commit(run: Run, proposal: Proposal, block: Block) -> float:
    """Commit the emitted tokens: roll the target back to them, then the drafter. Returns the
    drafter's seconds (its commit counts as drafting)."""
    verdict, m = block.verdict, block.emitted
    base = run.length - 1  # the cache position of the last committed id, row 0 of the verify
    run.tokens[run.length : run.length + verdict.tokens.shape[0]] = verdict.tokens
    if proposal.parents is None:
        run.lm.rollback(base + m)
        hidden = None if block.hidden is None else block.hidden[:m]
    else:
        rows = [0] + [node + 1 for node in verdict.accepted_nodes][: m - 1]  # the root, then the path
        run.lm.keep_path(base, rows)
        hidden = None if block.hidden is None else block.hidden[rows]
    assert run.pipeline is not None
    run.pipeline.commit(run.tokens[run.length : run.length + m].tolist() if run.pipeline.matcher is not None else [])
    run.length += m
    run.produced += m
    committed = verdict.accepted_nodes[: min(verdict.num_accepted, m)]
    if proposal.nodes is not None:
        committed = tuple(proposal.nodes[i] for i in committed)
    run.ctx = _context(run, hidden, committed, block.extra_logits)
    if not proposal.proposed or not hasattr(run.drafter, "commit"):
        return 0.0
    tick = time.perf_counter()
    _call(run, "commit", run.ctx, min(verdict.num_accepted, m))
    return time.perf_counter() - tick


def record(run: Run, proposal: Proposal, block: Block, commit_seconds: float) -> None:
    """Count the step, and add it to the trace."""
    n = proposal.draft.tokens.shape[0]
    reached = max(depths(proposal.parents), default=0) if proposal.parents is not None else n
    draft_seconds = proposal.seconds + commit_seconds
    run.counters.step(n, reached, block.verdict.num_accepted, draft_seconds, block.seconds)
    if run.trace is not None:
        shown = block.shown.all() if isinstance(block.shown, TreeLogits) else block.shown
        run.trace.record(proposal.draft, shown, run.pipeline, _shown_prefixes(run, proposal, block), block.verdict,
                         block.emitted, draft_seconds, block.seconds, proposal.parents,
                         _cache_lengths(run, proposal, block))


def _cache_lengths(run: Run, proposal: Proposal, block: Block) -> CacheLengths:
    """The traced step's cache lengths: asked, verified (target) / drafted (drafter), committed."""
    target = (*block.lengths, run.lm.cache_length)
    after = _drafter_length(run)
    if after is None:
        return CacheLengths(target)
    asked = proposal.drafter_lengths if proposal.drafter_lengths is not None else (after, after)  # not asked: unchanged
    return CacheLengths(target, (*asked, after))


def _drafter_length(run: Run) -> int | None:
    """The positions the drafter's own cache holds, when it reports them (`cache_length`)."""
    length = getattr(run.drafter, "cache_length", None)
    return length if isinstance(length, int) and not isinstance(length, bool) else None


def first_stop(out: torch.Tensor, num_accepted: torch.Tensor, stop: torch.Tensor | None) -> torch.Tensor:
    """The index of the first stop id in out[: num_accepted + 1], or len(out) when there is none (0-d, on
    the device: the loop reads it back with the number accepted)."""
    index = torch.arange(out.shape[0], device=out.device)  # (n + 1,)
    if stop is None:
        return torch.full((), out.shape[0], dtype=torch.long, device=out.device)
    hit = torch.isin(out, stop) & (index <= num_accepted.to(out.device))
    return torch.where(hit, index, out.shape[0]).min()


def _check_tree(run: Run, proposed: Draft, k: int, parents: list[int]) -> None:
    """A tree's values and its extra rows' (it is walked on the host, so they are read now) and its size."""
    validate_draft(proposed, k, run.lm.vocab_size, run.lm.device, run.name, extra_rows=run.engine.extra_rows)
    check_tree_size(run.name, run.k, run.engine, parents)


def _with_extra(run: Run, proposed: Draft, k: int, parents: list[int] | None
                ) -> tuple[Draft, list[int] | None]:
    """A draft with extra rows: a chain becomes a chain-shaped tree, so the rows ride its tree
    forward (`_check_tree` then checks their values). A target that cannot run such rows
    (`CausalLM.masked_obstacle`) drops them, checked first (warned once per run); the drafter then
    reads ctx.extra_logits = None."""
    if run.lm.masked_obstacle is not None:
        validate_draft(proposed, k, run.lm.vocab_size, run.lm.device, run.name, extra_rows=run.engine.extra_rows)
        if not run.warned_extra:
            warnings.warn(f"specdec: {type(run.lm.model).__name__} cannot run the extra rows of drafter "
                          f"{run.name!r} in its verify forward: {run.lm.masked_obstacle}; they are dropped "
                          "(the drafter reads ctx.extra_logits = None)", stacklevel=5)
            run.warned_extra = True
        return replace(proposed, extra=None), parents
    return proposed, parents if parents is not None else chain_parents(proposed.tokens.shape[0])


def _first_path(run: Run, proposed: Draft, parents: list[int]) -> tuple[Draft, list[int]]:
    """The tree's first-child path as a chain, for a target that cannot verify trees (warned
    once per run), and the node behind each of its positions."""
    if not run.warned:
        warnings.warn(f"specdec: {type(run.lm.model).__name__} cannot verify token trees: "
                      f"{run.lm.tree_obstacle}; the trees of drafter {run.name!r} are verified as "
                      "chains (each tree's first-child path)", stacklevel=5)
        run.warned = True
    nodes = first_path(parents)
    probs = None if proposed.probs is None else proposed.probs[nodes]
    return Draft(proposed.tokens[nodes], probs), nodes


def _verify_tree(run: Run, tree: TreeLogits, draft_: Draft, parents: list[int]) -> Verdict:
    """The tree's verdict under the run's rule; each node's p from its own path when the settings
    read the prefix (all rows at once then: a constraint's matcher walks the tree once), each
    node's q as its siblings were drawn (`sibling_rows`)."""
    pipeline, sampling = run.pipeline, run.sampling
    assert pipeline is not None
    verify_tree = tree_rule(run.verify_rule)
    q = None if sampling.greedy else sibling_rows(draft_.probs, draft_.tokens.tolist(), parents, draft_.siblings)
    if sampling.reads_prefix:
        logits = tree.all()  # (n + 1, V)
        prefixes = draft_prefixes(run, draft_.tokens, parents)
        if sampling.greedy:
            argmax = pipeline.argmax(logits, prefixes).tolist()
            return verify_tree_greedy(argmax.__getitem__, draft_.tokens, parents)
        p = pipeline.probabilities(logits, prefixes)  # (n + 1, V)
        return verify_tree(p.__getitem__, draft_.tokens, parents, q, run.generator)
    if sampling.greedy:
        if sampling.plain:
            return verify_tree_greedy(tree.argmax, draft_.tokens, parents)
        return verify_tree_greedy(lambda row: int(pipeline.argmax(tree.row(row)[None], None)), draft_.tokens, parents)
    return verify_tree(lambda row: pipeline.probabilities(tree.row(row)[None], None)[0], draft_.tokens, parents,
                       q, run.generator)


def draft_prefixes(run: Run, draft_tokens: torch.Tensor, parents: list[int] | None) -> Prefixes | None:
    """Each verify row's prefix (the committed ids, then the row's draft path), when the settings
    read it; None otherwise."""
    if not run.sampling.reads_prefix:
        return None
    return Prefixes.of_verify(run.tokens[: run.length], run.prompt_length, draft_tokens, parents)


def _shown_prefixes(run: Run, proposal: Proposal, block: Block) -> Prefixes | None:
    """The traced rows' prefixes as the verify had them (the commit has since moved run.length)."""
    if not run.sampling.reads_prefix:
        return None
    committed = run.tokens[: run.length - block.emitted]
    return Prefixes.of_verify(committed, run.prompt_length, proposal.draft.tokens, proposal.parents)


def _context(run: Run, hidden: torch.Tensor | None, accepted: tuple[int, ...],
             extra_logits: torch.Tensor | None = None) -> DraftContext:
    return DraftContext(run.tokens[: run.length], run.sampling, run.generator, run.lm, run.lm.vocab_size, hidden,
                        accepted, run.engine, extra_logits, run.max_new_tokens - run.produced, run.pipeline,
                        run.tokenizer)


def _call(run: Run, method: str, *args: Any) -> Any:
    """The drafter's `method`; whatever it raises comes back as a DraftError naming it and the method."""
    return call_drafter(run.drafter, run.name, method, *args)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
