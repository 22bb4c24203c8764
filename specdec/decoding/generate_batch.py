"""`specdec.generate_batch`: many prompts decoded together, each row exactly as if alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from specdec.decoding.batch_drafters import batched
from specdec.decoding.batch_loop import decode_batch
from specdec.decoding.batch_state import BatchRun, Row
from specdec.decoding.counters import Counters
from specdec.decoding.generate import (_drafter_name, _eos_ids, _prompt, _resolve_drafter, agreed_rule, agreed_seed,
                                       check_settings, engine_for, make_pipeline)
from specdec.protocols import Drafter
from specdec.runtime.batch_target import BatchLM
from specdec.runtime.target import CausalLM
from specdec.types import BatchGenerations, Sampling, static_capacity
from specdec.verifier import DEFAULT_RULE, check_verify_rule

__all__ = ["HOLE_ROOM", "generate_batch"]

HOLE_ROOM = 128  # cache columns beyond the longest row and the widest verify, for holes before a compaction


def generate_batch(
    target: PreTrainedModel | CausalLM,
    prompts: Sequence[Sequence[int] | torch.Tensor],
    drafter: Drafter | str | None = None,
    num_draft_tokens: int = 4,
    max_new_tokens: int = 128,
    sampling: Sampling = Sampling(),
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | None = None,
    compile: bool = False,
    tokenizer: Any = None,
    verify_rule: str = DEFAULT_RULE,
) -> BatchGenerations:
    """Generate up to `max_new_tokens` tokens after each prompt, all rows in one target forward per step.

    Each row is decoded exactly as `specdec.generate` decodes it alone: at temperature 0 its tokens
    equal its own batch-1 decoding; above, its output follows plain sampling. Prompts may have
    any lengths; every row accepts its own number of draft tokens per step (its rejected
    positions stay in the cache as masked holes, `specdec.runtime.batch_target`), and a row that emits
    an EOS id or spends its budget stops drafting and leaves the batch forward. Row i draws its
    random numbers from its own generator, seeded with `seed + i`. The drafter drafts every row:
    batched drafters (`propose_batch`) at once, any other drafter with one instance per row
    (`specdec.decoding.batch_drafters`). `compile=True` runs the steps compiled, on a few batch shapes.
    Settings that read the prefix (penalties, processors, a constraint, which needs `tokenizer`)
    process each row from its own history, with its own constraint state. `verify_rule` picks the
    verification rule, as for `specdec.generate`.

    Returns one Generation per prompt, in order, with its row's Stats; `.totals` has the batch's.
    """
    lm = target if isinstance(target, CausalLM) else CausalLM(target)
    check_settings(sampling, num_draft_tokens, max_new_tokens, compile, seed)
    check_verify_rule(verify_rule)
    verify_rule = agreed_rule(lm, verify_rule)
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
    resolved = _resolve_drafter(drafter) if num_draft_tokens > 0 else None
    stop_ids = _eos_ids(eos_token_id, lm.vocab_size)
    k = num_draft_tokens if resolved is not None else 0
    engine = engine_for(resolved, k, max(prompt.shape[0] for prompt in checked) + max_new_tokens, compile)
    name = _drafter_name(resolved)
    base = agreed_seed(lm, seed)
    with torch.inference_mode():
        batch_target = BatchLM(lm, len(checked), static_capacity(engine.max_length + engine.verify_rows + HOLE_ROOM),
                               compile=compile)
        if engine.extra_rows and batch_target.kv.recurrent:
            raise ValueError(f"drafter {name!r} drafts extra rows, which {type(lm.model).__name__} cannot run: its "
                             "linear-attention layers continue one row from one earlier row, and an extra row sees "
                             "several; decode these prompts with specdec.generate (which drops the extra rows with a "
                             "warning) or choose a drafter without extra rows")
        rows = []
        for i, prompt in enumerate(checked):
            tokens = torch.zeros(engine.max_length + engine.verify_rows, dtype=torch.long, device=lm.device)
            tokens[: prompt.shape[0]] = prompt
            generator = torch.Generator(device=lm.device)
            generator.manual_seed(base + i)
            pipeline = make_pipeline(sampling, lm.vocab_size, prompt.shape[0], tokenizer)
            rows.append(Row(i, tokens, prompt.shape[0], generator, Counters(k), pipeline=pipeline))
            if pipeline.matcher is not None:
                stop_ids |= frozenset(pipeline.matcher.stop_ids)
        run = BatchRun(batch_target, lm, None if resolved is None else batched(resolved, name, len(rows)), resolved,
                       name, k, max_new_tokens, sampling, stop_ids, engine, rows, buckets=batch_target.compiled,
                       verify_rule=verify_rule, tokenizer=tokenizer)
        return decode_batch(run)
