"""`specdec.generate`: check the arguments, set up one run, and decode it (`specdec.decoding.loop`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from specdec.decoding.loop import Run, decode
from specdec.processing.pipeline import Pipeline
from specdec.protocols import Drafter
from specdec.runtime.target import CausalLM
from specdec.teaching.trace import Trace
from specdec.types import Engine, Generation, Sampling, UNDECLARED_NODES
from specdec.verifier import DEFAULT_RULE, VERIFY_RULES, DraftError, check_verify_rule

__all__ = ["generate", "make_pipeline"]


def generate(
    target: PreTrainedModel | CausalLM,
    input_ids: Sequence[int] | torch.Tensor,
    drafter: Drafter | str | None = None,
    num_draft_tokens: int = 4,
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
    """
    lm = target if isinstance(target, CausalLM) else CausalLM(target, share_cache=True)
    check_settings(sampling, num_draft_tokens, max_new_tokens, compile, seed)
    verify_rule = agreed_rule(lm, check_verify_rule(verify_rule))
    prompt = _prompt(input_ids, lm, max_new_tokens)
    resolved = _resolve_drafter(drafter) if num_draft_tokens > 0 else None  # k = 0: plain decoding
    stop_ids = _eos_ids(eos_token_id, lm.vocab_size)
    pipeline = make_pipeline(sampling, lm.vocab_size, prompt.shape[0], tokenizer)
    if pipeline.matcher is not None:
        stop_ids |= frozenset(pipeline.matcher.stop_ids)
    if compile and lm.static_obstacle is not None:
        warnings.warn(f"specdec: {type(lm.model).__name__} decodes eagerly: {lm.static_obstacle}", stacklevel=2)
    k = num_draft_tokens if resolved is not None else 0
    engine = engine_for(resolved, k, prompt.shape[0] + max_new_tokens, compile)
    generator = torch.Generator(device=lm.device)
    generator.manual_seed(agreed_seed(lm, seed))
    if trace is not None:
        trace.verify_rule = verify_rule  # what each step's tests mean (`specdec.teaching.trace_view`)
    with torch.inference_mode():
        tokens = torch.zeros(engine.max_length + engine.verify_rows, dtype=torch.long, device=lm.device)
        tokens[: prompt.shape[0]] = prompt
        stop = torch.tensor(sorted(stop_ids), dtype=torch.long, device=lm.device) if stop_ids else None
        run = Run(lm, resolved, _drafter_name(resolved), num_draft_tokens, max_new_tokens, sampling, generator,
                  stop, engine, tokens, prompt.shape[0], trace, pipeline=pipeline, verify_rule=verify_rule,
                  tokenizer=tokenizer)
        return decode(run)


def make_pipeline(sampling: Sampling, vocab_size: int, prompt_length: int, tokenizer: Any) -> Pipeline:
    """The generation's sampling pipeline, with its constraint's matcher when it has one."""
    matcher = None
    if sampling.constraint is not None:
        from specdec.processing.constraint import Matcher, compile_constraint

        kind, text = sampling.constraint
        matcher = Matcher(compile_constraint(kind, text, tokenizer, vocab_size), vocab_size)
    return Pipeline(sampling, vocab_size, prompt_length, matcher)


def check_settings(sampling: Sampling, num_draft_tokens: int, max_new_tokens: int, compile: bool,
                   seed: int | None) -> None:
    """Raise naming the bad value among the settings `generate` and `generate_batch` share."""
    if not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a specdec.Sampling, got {type(sampling).__name__}")
    _check_count("num_draft_tokens", num_draft_tokens)
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


def engine_for(drafter: Drafter | None, k: int, max_length: int, compile: bool) -> Engine:
    """The Engine of a generation: `max_length` committed tokens at most, the loop's k, and the
    drafter's declared tree budget and extra rows."""
    nodes = _draft_nodes(drafter, k)
    return Engine(compile=compile, max_length=max_length, max_draft=k,
                  draft_nodes=nodes if nodes is not None else max(k, UNDECLARED_NODES), declared=nodes is not None,
                  extra_rows=_extra_rows(drafter, k))


def _draft_nodes(drafter: Drafter | None, k: int) -> int | None:
    """The most nodes the drafter's drafts hold at depth k, as its `max_draft_nodes(k)` declares
    (k without a drafter); None when it declares nothing."""
    declared = getattr(drafter, "max_draft_nodes", None)
    if drafter is None or k == 0:
        return k
    if not callable(declared):
        return None
    nodes = declared(k)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise DraftError(f"drafter {_drafter_name(drafter)!r}: max_draft_nodes({k}) must return an int >= 1, "
                         f"got {nodes!r}")
    return max(nodes, k)


def _extra_rows(drafter: Drafter | None, k: int) -> int:
    """The most extra rows the drafter's drafts carry, as its `extra_rows()` declares (0 without one)."""
    declared = getattr(drafter, "extra_rows", None)
    if drafter is None or k == 0 or not callable(declared):
        return 0
    rows = declared()
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise DraftError(f"drafter {_drafter_name(drafter)!r}: extra_rows() must return an int >= 0, got {rows!r}")
    return rows


def _check_count(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field} must be an int >= 0, got {value!r}")


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


def _resolve_drafter(drafter: Drafter | str | None) -> Drafter | None:
    if drafter is None:
        return None
    if isinstance(drafter, str):
        from specdec.plugins import make_drafter

        return make_drafter(drafter)
    if isinstance(drafter, type):
        raise TypeError(f"pass a drafter instance, not the class {drafter.__name__} "
                        "(e.g. specdec.make_drafter(name, **options))")
    if not callable(getattr(drafter, "propose", None)):
        raise TypeError(f"{type(drafter).__name__} is not a Drafter: it has no propose(ctx, k) method")
    return drafter


def _drafter_name(drafter: Drafter | None) -> str:
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
