"""The decode loop: prefill, then draft -> verify -> accept -> roll back until done.

Plain decoding (no drafter) is the same loop with empty drafts, so both share one sampling
pipeline and one code path for EOS, budgets and statistics.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from specdec.protocols import DraftContext, Drafter
from specdec.sampling import probabilities
from specdec.target import CausalLM
from specdec.trace import Trace
from specdec.trees import depths, first_path
from specdec.types import Draft, Generation, Sampling, Stats, Verdict
from specdec.verifier import (DraftError, validate_draft, verify_chain, verify_greedy, verify_tree,
                              verify_tree_greedy)

__all__ = ["generate"]


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
) -> Generation:
    """Generate up to `max_new_tokens` tokens after `input_ids`, speculatively if a drafter is given.

    The output distribution is exactly that of plain sampling with `sampling`; at temperature 0
    the tokens equal plain greedy decoding. The EOS token, when produced, ends `tokens`.
    `trace`, if given, receives every step's tokens, probabilities, draws and timings
    (`specdec.trace`); recording costs a softmax per step.
    """
    lm = target if isinstance(target, CausalLM) else CausalLM(target)
    if not isinstance(sampling, Sampling):
        raise TypeError(f"sampling must be a specdec.Sampling, got {type(sampling).__name__}")
    _check_count("num_draft_tokens", num_draft_tokens)
    _check_count("max_new_tokens", max_new_tokens)
    prompt = _prompt(input_ids, lm, max_new_tokens)
    resolved = _resolve_drafter(drafter) if num_draft_tokens > 0 else None  # k = 0: plain decoding
    stop_ids = _eos_ids(eos_token_id, lm.vocab_size)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an int or None, got {seed!r}")
    generator = torch.Generator(device=lm.device)
    generator.manual_seed(int(torch.randint(0, 2**62, (1,))) if seed is None else seed)
    with torch.inference_mode():
        return _decode(lm, prompt, resolved, num_draft_tokens, max_new_tokens, sampling, stop_ids,
                       generator, trace)


def _decode(lm: CausalLM, prompt: torch.Tensor, drafter: Drafter | None, k: int, max_new_tokens: int,
            sampling: Sampling, stop_ids: frozenset[int], generator: torch.Generator,
            trace: Trace | None = None) -> Generation:
    start = time.perf_counter()
    name = _drafter_name(drafter)
    wants_hidden = bool(getattr(drafter, "uses_hidden_states", False))
    propose = drafter.propose if drafter is not None else None
    commit = getattr(drafter, "commit", None)
    prompt_length = prompt.shape[0]
    tokens = torch.empty(prompt_length + max_new_tokens, dtype=torch.long, device=lm.device)
    tokens[:prompt_length] = prompt
    length = prompt_length
    empty = tokens[:0]

    lm.reset()
    hidden = torch.empty(0, lm.hidden_size, dtype=lm.dtype, device=lm.device) if wants_hidden else None
    if prompt_length > 1:
        _, hidden = lm.forward(prompt[:-1], keep=1, hidden=wants_hidden)  # cache: all but the last
    ctx = DraftContext(tokens[:length], sampling, generator, lm, lm.vocab_size, hidden)
    if drafter is not None and hasattr(drafter, "prefill"):
        drafter.prefill(ctx)
    prefill_seconds = time.perf_counter() - start
    if trace is not None:
        trace.prompt, trace.steps, trace.prefill_seconds = prompt.tolist(), [], prefill_seconds

    new: list[int] = []
    warned = False  # the tree fallback's warning, once per call
    steps = drafted = accepted = 0
    drafted_at = [0] * k
    accepted_at = [0] * k
    draft_seconds = verify_seconds = 0.0
    while len(new) < max_new_tokens:
        budget = max_new_tokens - len(new)
        draft = Draft(empty)
        proposed = propose is not None and budget > 1
        step_draft = 0.0
        parents: list[int] | None = None
        nodes: list[int] | None = None  # draft node of each chain position after a tree fallback
        if propose is not None and proposed:
            tick = time.perf_counter()
            draft = propose(ctx, min(k, budget - 1))
            parents = validate_draft(draft, min(k, budget - 1), lm.vocab_size, lm.device, name)
            if lm.cache_length != length - 1:
                raise DraftError(f"drafter {name!r} changed the target's KV cache ({length - 1} -> "
                                 f"{lm.cache_length} positions); drafters must not run ctx.target.forward")
            if parents is not None and lm.tree_obstacle is not None:
                if not warned:
                    warnings.warn(f"specdec: {type(lm.model).__name__} cannot verify token trees: "
                                  f"{lm.tree_obstacle}; the trees of drafter {name!r} are verified as "
                                  "chains (each tree's first-child path)", stacklevel=3)
                    warned = True
                nodes = first_path(parents)
                draft = Draft(draft.tokens[nodes], None if draft.probs is None else draft.probs[nodes])
                parents = None
            _synchronize(lm.device)
            step_draft = time.perf_counter() - tick
        tick = time.perf_counter()
        n = draft.tokens.shape[0]
        verdict: Verdict
        if parents is None:
            tokens[length : length + n] = draft.tokens  # scratch beyond the committed length
            logits, hidden = lm.forward(tokens[length - 1 : length + n], keep=n + 1, hidden=wants_hidden)
            if sampling.greedy:
                verdict = verify_greedy(logits.argmax(dim=-1), draft.tokens)
            else:
                verdict = verify_chain(probabilities(logits, sampling), draft.tokens, draft.probs, generator)
        else:
            tree = lm.forward_tree(torch.cat([tokens[length - 1 : length], draft.tokens]), parents)
            hidden = tree.hidden if wants_hidden else None
            if sampling.greedy:
                verdict = verify_tree_greedy(tree.argmax, draft.tokens, parents)
            else:
                verdict = verify_tree(lambda row: probabilities(tree.row(row), sampling), draft.tokens, parents,
                                      draft.probs, generator)
        emitted = _until_stop(verdict.tokens.tolist(), stop_ids)
        m = len(emitted)
        tokens[length + verdict.num_accepted : length + m] = verdict.tokens[verdict.num_accepted : m]
        if parents is None:
            lm.rollback(length + m - 1)
        else:
            tokens[length : length + m] = verdict.tokens[:m]
            rows = [0] + [node + 1 for node in verdict.accepted_nodes][: m - 1]  # root, then the path
            lm.keep_path(length - 1, rows)
            hidden = None if hidden is None else hidden[rows]
        length += m
        new.extend(emitted)

        steps += 1
        drafted += n
        accepted += verdict.num_accepted
        reached = max(depths(parents), default=0) if parents is not None else n
        for i in range(reached):
            drafted_at[i] += 1
        for i in range(verdict.num_accepted):
            accepted_at[i] += 1
        committed = verdict.accepted_nodes[: min(verdict.num_accepted, m)]
        if nodes is not None:
            committed = tuple(nodes[i] for i in committed)
        ctx = DraftContext(tokens[:length], sampling, generator, lm, lm.vocab_size,
                           None if hidden is None else hidden[:m], committed)
        step_verify = time.perf_counter() - tick
        verify_seconds += step_verify
        if proposed and commit is not None:
            tick = time.perf_counter()
            commit(ctx, min(verdict.num_accepted, m))
            step_draft += time.perf_counter() - tick
        draft_seconds += step_draft
        if trace is not None:
            shown = logits if parents is None else tree.all()  # a tree's rows, computed for the trace only
            trace.record(draft, shown, sampling, verdict, m, step_draft, step_verify, parents)
        if emitted and emitted[-1] in stop_ids:
            break

    stats = Stats(steps=steps, new_tokens=len(new), drafted=drafted, accepted=accepted,
                  accepted_per_position=tuple(accepted_at), drafted_per_position=tuple(drafted_at),
                  prefill_seconds=prefill_seconds, draft_seconds=draft_seconds,
                  verify_seconds=verify_seconds, wall_seconds=time.perf_counter() - start)
    return Generation(tokens=new, stats=stats)


def _until_stop(emitted: list[int], stop_ids: frozenset[int]) -> list[int]:
    """The emitted tokens up to and including the first stop id."""
    for i, token in enumerate(emitted):
        if token in stop_ids:
            return emitted[: i + 1]
    return emitted


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
