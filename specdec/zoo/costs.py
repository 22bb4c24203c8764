"""The draft tax of each drafter, measured: what one draft step costs against one target forward.

A speculative step costs one verify forward plus the drafting, so a drafter pays only when its
accepted tokens outweigh that tax (design §7). Real models have a shape where the tax is small —
one EAGLE or MTP layer beside 32 target layers costs about a tenth of a target forward — and the
zoo is shaped to keep those proportions; these figures are how the build checks it.

Every figure comes from decoding itself, on the engine the benchmarks use (compiled unless told
otherwise): `draft_seconds` is the drafter's propose and commit per verify step, greedy with chains
of k tokens, so it includes the drafter's catch-up on the tokens just accepted and its own glue.

- `target_forward_seconds`: T(1), the median of one-token forwards after a cached prefix
  (`specdec.runtime.timing.forward_costs`).
- `draft_seconds`: the median over rounds of drafting seconds per verify step.
- `model_steps`: the drafter forwards one draft makes: k for a model drafting a chain token by
  token (draft-model, EAGLE, EAGLE-3, MTP), 1 for Medusa (all heads in one pass) and for the block
  drafters (DFlash, PARD: the whole draft in one forward), 0 for a
  model-free drafter (n-grams, suffix trees, a datastore, lookahead's pool).
- `step_seconds` = draft_seconds / model_steps, one draft step; `step_ratio` = step_seconds / T(1),
  the figure the zoo's proportions are judged by (at most 1/10 for a drafter layer, 1/8 for the
  draft model).
- `draft_tax` = draft_seconds / T(1): the whole draft of one verify step, in target forwards.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from specdec.decoding.generate import generate
from specdec.protocols import forget
from specdec.runtime.target import CausalLM
from specdec.runtime.timing import forward_costs

__all__ = ["MODEL_STEPS", "draft_costs", "model_steps"]

# drafter forwards per draft of a chain of k tokens, by zoo label: "k" for token-by-token drafters (the self
# drafter's forward runs the target's kept layers)
MODEL_STEPS: dict[str, str | int] = {"draft-model": "k", "draft-model-xtok": "k", "eagle": "k", "eagle3": "k",
                                     "eagle3-k15": "k", "mtp": "k", "self": "k", "medusa": 1, "dflash": 1, "pard": 1}


def model_steps(name: str, k: int) -> int:
    """The drafter forwards one draft of `name` (a zoo label) makes for a chain of k tokens (0: no model)."""
    steps = MODEL_STEPS.get(name, 0)
    return k if steps == "k" else int(steps)


def draft_costs(target: CausalLM, drafters: dict[str, Callable[[], Any]], prompts: Sequence[torch.Tensor],
                k: int = 4, new_tokens: int = 64, rounds: int = 3, compile: bool = True,
                tokenizer: Any = None) -> dict[str, Any]:
    """Each drafter's draft tax on `target` (see the module docstring), one entry per name.

    Every drafter decodes every prompt greedily `rounds` times after a warm-up round (which
    compiles, outside the figures); its per-round drafting seconds per verify step give the
    median. `tokenizer` is the target's, for drafters that need it (another vocabulary's draft
    model, the self drafter's search). Returns {"target_forward_seconds": T(1), "k": k,
    "drafters": {name: figures}}.
    """
    if not prompts:
        raise ValueError("draft_costs needs at least one prompt")
    t1 = forward_costs(target, prompts[0], [1], repeats=30, compile=compile)[1]
    out: dict[str, Any] = {}
    for name, make in drafters.items():
        drafter = make()
        per_round = []
        for round_index in range(rounds + 1):  # round 0 warms up (and compiles)
            forget(drafter)  # a drafter that remembers outputs drafts each round afresh
            seconds = steps = 0.0
            for prompt in prompts:
                stats = generate(target, prompt, drafter=drafter, num_draft_tokens=k, max_new_tokens=new_tokens,
                                 compile=compile, tokenizer=tokenizer).stats
                seconds, steps = seconds + stats.draft_seconds, steps + stats.steps
            if round_index:
                per_round.append(seconds / max(steps, 1))
        draft = statistics.median(per_round)
        forwards = model_steps(name, k)
        step = draft / forwards if forwards else None
        out[name] = {"draft_seconds": draft, "model_steps": forwards, "step_seconds": step,
                     "step_ratio": None if step is None else step / t1, "draft_tax": draft / t1}
    return {"target_forward_seconds": t1, "k": k, "compiled": compile, "drafters": out}
