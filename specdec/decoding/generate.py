"""`specdec.generate` and `specdec.generate_batch`: check the arguments, set up one run of one or
more rows, and decode it (`specdec.decoding.loop`). `generate` is `generate_batch` of one prompt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from specdec.decoding.adaptive import AdaptiveDraftLength
from specdec.decoding.auto_draft import AUTO_DRAFT_MAX, AutoDraft
from specdec.decoding.counters import Counters
from specdec.decoding.drafting import hidden_layers
from specdec.decoding.loop import decode
from specdec.decoding.row_drafters import RowDrafters
from specdec.decoding.run import Plan, Row, Run
from specdec.distributed.agreement import Agreement
from specdec.processing.pipeline import Pipeline
from specdec.protocols import Capability, Drafter, check_declarations, declares, is_rows_drafter
from specdec.runtime.batch_target import BatchLM
from specdec.runtime.rows import OneRow
from specdec.runtime.target import CausalLM
from specdec.teaching.trace import Trace
from specdec.types import BatchGenerations, Engine, Generation, Sampling, UNDECLARED_NODES, static_capacity
from specdec.verifier import DEFAULT_RULE, VERIFY_RULES, DraftError, check_verify_rule

__all__ = ["HOLE_ROOM", "engine_for", "generate", "generate_batch", "make_pipeline", "resolve_drafter"]

HOLE_ROOM = 128  # a batch's cache columns beyond the longest row and the widest verify, for holes before a compaction


def generate(
    target: PreTrainedModel | CausalLM,
    input_ids: Sequence[int] | torch.Tensor,
    drafter: Drafter | Any | str | None = None,
    num_draft_tokens: int | str = 4,
    max_new_tokens: int = 128,
    sampling: Sampling = Sampling(),
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | None = None,
    trace: Trace | None = None,
    compile: bool = False,
    tokenizer: Any = None,
    verify_rule: str = DEFAULT_RULE,
) -> Generation:
    """Generate up to `max_new_tokens` tokens after `input_ids`, speculatively if a drafter is given.

    The output distribution is exactly that of plain sampling with `sampling`; at temperature 0
    the tokens equal plain greedy decoding. The EOS token, when produced, ends `tokens`.
    `trace`, if given, receives every step's tokens, probabilities, draws and timings
    (`specdec.teaching.trace`); recording costs a softmax per step. `compile=True` runs the target's and
    the drafter's fixed-shape steps through `torch.compile` (CUDA graphs on CUDA); the tokens
    are those of eager decoding. Graphs are kept for later calls with the same shapes; a model
    that cannot run on a static cache (Mamba2 layers, chunked or flash attention, a model
    transformers runs on dynamic caches only) decodes eagerly, with a warning saying why.
    `tokenizer` (the target's) is needed by a constraint (`Sampling.json_schema`, `regex`,
    `grammar`); a constrained generation also ends at the grammar's stop ids (the tokenizer's EOS).
    `verify_rule` picks the verification rule (`specdec.verifier.rules`): "token", "block" or
    "traversal"; every rule is lossless, they differ in how many draft tokens they keep.
    `num_draft_tokens="auto"` drafts only when it pays, from the step times measured on the engine
    in use and the running acceptance, up to `AUTO_DRAFT_MAX` tokens and down to none
    (`specdec.decoding.auto_draft`); each step's decision is in the trace.
    """
    lm = target if isinstance(target, CausalLM) else CausalLM(target, share_cache=True)
    prompt = _prompt(input_ids, lm, max_new_tokens)
    return _generate(lm, [prompt], drafter, num_draft_tokens, max_new_tokens, sampling, eos_token_id, seed, compile,
                     tokenizer, verify_rule, [trace])[0]


def generate_batch(
    target: PreTrainedModel | CausalLM,
    prompts: Sequence[Sequence[int] | torch.Tensor],
    drafter: Drafter | Any | str | None = None,
    num_draft_tokens: int | str = 4,
    max_new_tokens: int = 128,
    sampling: Sampling = Sampling(),
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | None = None,
    compile: bool = False,
    tokenizer: Any = None,
    verify_rule: str = DEFAULT_RULE,
    traces: Sequence[Trace | None] | None = None,
) -> BatchGenerations:
    """Generate up to `max_new_tokens` tokens after each prompt, all rows in one target forward per step.

    Each row is decoded exactly as `specdec.generate` decodes it alone: at temperature 0 its tokens
    equal its own batch-1 decoding; above, its output follows plain sampling. Prompts may have
    any lengths; every row accepts its own number of draft tokens per step (its rejected
    positions stay in the cache as masked holes, `specdec.runtime.batch_target`), and a row that emits
    a stop id or spends its budget stops drafting and leaves the batch forward. Row i draws its
    random numbers from its own generator, seeded with `seed + i`. The drafter drafts for every
    live row at once (`specdec.Drafter`; a drafter of the earlier one-row protocol with one
    instance per row, `specdec.decoding.row_drafters`). `compile=True` runs the steps compiled, on a
    few batch shapes. Settings that read the prefix (penalties, processors, a constraint, which
    needs `tokenizer`) process each row from its own history, with its own constraint state.
    `verify_rule` picks the verification rule, as for `specdec.generate`; `traces[i]`, if given,
    records row i's steps as `generate(trace=)` does.

    Returns one Generation per prompt, in order, with its row's Stats; `.totals` has the batch's.
    """
    lm = target if isinstance(target, CausalLM) else CausalLM(target)
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, Sequence) or isinstance(prompts, str) \
            or not prompts:
        raise ValueError("prompts must be a non-empty list of prompts (each a list of token ids or a 1-D "
                         f"LongTensor), got {type(prompts).__name__}")
    checked = []
    for i, prompt in enumerate(prompts):
        try:
            checked.append(_prompt(prompt, lm, max_new_tokens))
        except ValueError as error:
            raise ValueError(f"prompts[{i}]: {error}") from error
    if traces is not None and len(traces) != len(checked):
        raise ValueError(f"traces must hold one Trace (or None) per prompt: {len(checked)} prompts, "
                         f"{len(traces)} traces")
    return _generate(lm, checked, drafter, num_draft_tokens, max_new_tokens, sampling, eos_token_id, seed, compile,
                     tokenizer, verify_rule, list(traces) if traces is not None else [None] * len(checked))


def _generate(lm: CausalLM, prompts: list[torch.Tensor], drafter: Any, num_draft_tokens: int | str,
              max_new_tokens: int,
              sampling: Sampling, eos_token_id: int | Sequence[int] | None, seed: int | None, compile: bool,
              tokenizer: Any, verify_rule: str, traces: list[Trace | None]) -> BatchGenerations:
    """Set up the run of `prompts` (checked, on the model's device) and decode it."""
    check_settings(sampling, num_draft_tokens, max_new_tokens, compile, seed)
    verify_rule = agreed_rule(lm, check_verify_rule(verify_rule))
    limit = AUTO_DRAFT_MAX if num_draft_tokens == "auto" else int(num_draft_tokens)
    resolved = resolve_drafter(drafter) if limit > 0 else None  # k = 0: plain decoding
    if num_draft_tokens == "auto" and resolved is not None and not isinstance(resolved, AdaptiveDraftLength):
        resolved = AutoDraft(resolved)  # drafts only when it pays (`specdec.decoding.auto_draft`)
    name = drafter_name(resolved)
    stop_ids = _eos_ids(eos_token_id, lm.vocab_size)
    k = limit if resolved is not None else 0
    engine = engine_for(resolved, k, max(prompt.shape[0] for prompt in prompts) + max_new_tokens, compile,
                        isinstance(resolved, AutoDraft))
    if compile and lm.static_obstacle is not None:
        import warnings

        warnings.warn(f"specdec: {type(lm.model).__name__} decodes eagerly: {lm.static_obstacle}", stacklevel=3)
    base = agreed_seed(lm, seed)
    with torch.inference_mode():
        pipelines = [make_pipeline(sampling, lm.vocab_size, prompt.shape[0], tokenizer) for prompt in prompts]
        for pipeline in pipelines:
            if pipeline.matcher is not None:
                stop_ids |= frozenset(pipeline.matcher.stop_ids)
        rows = []
        for i, (prompt, pipeline, trace) in enumerate(zip(prompts, pipelines, traces)):
            tokens = torch.zeros(engine.max_length + engine.verify_rows, dtype=torch.long, device=lm.device)
            tokens[: prompt.shape[0]] = prompt
            generator = torch.Generator(device=lm.device)
            generator.manual_seed(base + i)
            rows.append(Row(i, tokens, prompt.shape[0], generator, pipeline, Counters(limit), trace))
            if trace is not None:
                trace.verify_rule = verify_rule  # what each step's tests mean (`specdec.teaching.trace_view`)
        if len(prompts) == 1:  # a batch of one: the adapter's own cache, rolled back by length
            target: Any = OneRow(lm, engine)
        else:
            target = BatchLM(lm, len(prompts), static_capacity(engine.max_length + engine.verify_rows + HOLE_ROOM),
                             compile=compile, engine=engine)
        stop = torch.tensor(sorted(stop_ids), dtype=torch.long, device=lm.device) if stop_ids else None
        plan = Plan(name, k, max_new_tokens, sampling, frozenset(stop_ids), stop, engine, verify_rule, tokenizer,
                    hidden_layers(resolved, name, lm))
        run = Run(target, lm, resolved, plan, rows, Agreement(lm.ranks, engine),
                  buckets=len(prompts) > 1 and target.compiled)
        return decode(run)


def make_pipeline(sampling: Sampling, vocab_size: int, prompt_length: int, tokenizer: Any) -> Pipeline:
    """The generation's sampling pipeline, with its constraint's matcher when it has one."""
    matcher = None
    if sampling.constraint is not None:
        from specdec.processing.constraint import Matcher, compile_constraint

        kind, text = sampling.constraint
        matcher = Matcher(compile_constraint(kind, text, tokenizer, vocab_size), vocab_size)
    return Pipeline(sampling, vocab_size, prompt_length, matcher)


def check_settings(sampling: Sampling, num_draft_tokens: int | str, max_new_tokens: int, compile: bool,
                   seed: int | None) -> None:
    """Raise naming the bad value among the settings `generate` and `generate_batch` share."""
    if not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a specdec.Sampling, got {type(sampling).__name__}")
    if num_draft_tokens != "auto":
        _check_count("num_draft_tokens", num_draft_tokens, ' or "auto"')
    _check_count("max_new_tokens", max_new_tokens)
    if not isinstance(compile, bool):
        raise ValueError(f"compile must be True or False, got {compile!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an int or None, got {seed!r}")


def agreed_seed(lm: CausalLM, seed: int | None) -> int:
    """`seed`, or a fresh one when None; on a target sharded across ranks, the leader's (each rank
    may be given its own or none: every rank draws what the leader draws, `specdec.distributed.ranks`)."""
    value = int(torch.randint(0, 2**62, (1,))) if seed is None else seed
    return value if lm.ranks is None else lm.ranks.agree_seed(value)


def agreed_rule(lm: CausalLM, rule: str) -> str:
    """`rule`, or on a target sharded across ranks the leader's: every rank walks a tree the same
    way, so every rank computes the same rows (`specdec.distributed.ranks`)."""
    return rule if lm.ranks is None else VERIFY_RULES[lm.ranks.agree_value(VERIFY_RULES.index(rule))]


def engine_for(drafter: Drafter | None, k: int, max_length: int, compile: bool, short_chains: bool = False) -> Engine:
    """The Engine of a generation: `max_length` committed tokens at most, the loop's k, and the
    drafter's declared tree budget and extra rows (`Capability.TREES`, `Capability.EXTRA_ROWS`).
    `short_chains` (num_draft_tokens="auto", which chooses between one token and k) verifies a
    one-token chain in a forward of 2 rows rather than k + 1."""
    nodes = _draft_nodes(drafter, k)
    return Engine(compile=compile, max_length=max_length, max_draft=k,
                  draft_nodes=nodes if nodes is not None else max(k, UNDECLARED_NODES), declared=nodes is not None,
                  extra_rows=_extra_rows(drafter, k), chain_widths=(2, k + 1) if short_chains and k > 1 else ())


def _draft_nodes(drafter: Drafter | None, k: int) -> int | None:
    """The most nodes the drafter's drafts hold at depth k, as its `max_draft_nodes(k)` declares
    (k without a drafter); None when it declares nothing."""
    if drafter is None or k == 0:
        return k
    if not declares(drafter, Capability.TREES):
        return None
    nodes = drafter.max_draft_nodes(k)  # type: ignore[attr-defined]
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise DraftError(f"drafter {drafter_name(drafter)!r}: max_draft_nodes({k}) must return an int >= 1, "
                         f"got {nodes!r}")
    return max(nodes, k)


def _extra_rows(drafter: Drafter | None, k: int) -> int:
    """The most extra rows the drafter's drafts carry, as its `extra_rows()` declares (0 without one)."""
    if drafter is None or k == 0 or not declares(drafter, Capability.EXTRA_ROWS):
        return 0
    rows = drafter.extra_rows()  # type: ignore[attr-defined]
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise DraftError(f"drafter {drafter_name(drafter)!r}: extra_rows() must return an int >= 0, got {rows!r}")
    return rows


def _check_count(field: str, value: object, other: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field} must be an int >= 0{other}, got {value!r}")


def _prompt(input_ids: Sequence[int] | torch.Tensor, lm: CausalLM, max_new_tokens: int) -> torch.Tensor:
    """Validate the prompt and return it as LongTensor [T] on the model's device."""
    ids = input_ids if isinstance(input_ids, torch.Tensor) else torch.tensor(list(input_ids))
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"input_ids must be [T] or [1, T] (batch size 1), got shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError("input_ids is empty: give at least one prompt token (e.g. the BOS id)")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"input_ids must be integer token ids, got dtype {ids.dtype}")
    ids = ids.to(device=lm.device, dtype=torch.long)
    outside = ((ids < 0) | (ids >= lm.vocab_size)).nonzero().flatten().tolist()
    if outside:
        bad = ids[outside[:5]].tolist()
        raise ValueError(f"input_ids hold ids outside the vocabulary [0, {lm.vocab_size}): {bad} "
                         f"at positions {outside[:5]}")
    limit = lm.max_positions
    if limit is not None and ids.numel() > limit:
        raise ValueError(f"the prompt has {ids.numel()} tokens but the model was trained on {limit} "
                         "positions; shorten the prompt")
    if limit is not None and lm.learned_positions and ids.numel() + max_new_tokens > limit:
        raise ValueError(f"prompt ({ids.numel()} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"the model's {limit} learned positions; set max_new_tokens <= {limit - ids.numel()}")
    return ids


def resolve_drafter(drafter: Any) -> Drafter | None:
    """The run's drafter: a registered name made, a `Drafter` as it is (its declarations checked),
    and a drafter of the earlier one-row protocol through its adapter (`RowDrafters`)."""
    if drafter is None:
        return None
    if isinstance(drafter, str):
        from specdec.plugins import make_drafter

        drafter = make_drafter(drafter)
    if isinstance(drafter, type):
        raise TypeError(f"pass a drafter instance, not the class {drafter.__name__} "
                        "(e.g. specdec.make_drafter(name, **options))")
    if not callable(getattr(drafter, "propose", None)):
        raise TypeError(f"{type(drafter).__name__} is not a Drafter: it has no propose method")
    if is_rows_drafter(drafter):
        check_declarations(drafter, drafter_name(drafter))
        return drafter
    return RowDrafters(drafter, drafter_name(drafter))


def drafter_name(drafter: Any) -> str:
    """The drafter's registry name (its class's name when it has none)."""
    if isinstance(drafter, RowDrafters):
        return drafter.name
    return str(getattr(drafter, "name", type(drafter).__name__))


def _eos_ids(eos_token_id: int | Sequence[int] | None, vocab_size: int) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    ids = [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id
    if not isinstance(ids, (list, tuple, set, frozenset)) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    outside = sorted(i for i in ids if not 0 <= i < vocab_size)
    if outside:
        raise ValueError(f"eos_token_id {outside} outside the vocabulary [0, {vocab_size})")
    return frozenset(ids)
