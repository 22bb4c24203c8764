"""Running the bench: every contender on every question turn, repeats interleaved, plain
decoding of the same target first in each round (its answers are the multi-turn context for
every contender, so all contenders see identical prompts).

Batch 1, prefill included in the timings, warm-up rounds not recorded: Spec-Bench's protocol.
Compilation is kept apart: the seconds torch.compile spent inside a call are taken off its
time and reported on their own (the warm-up round meets most graphs first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import PreTrainedModel

from specdec.adaptive import AdaptiveDraftLength
from specdec.bench.peers import hf_generate
from specdec.bench.questions import Question
from specdec.engine import compile_seconds
from specdec.generate import generate
from specdec.plugins import make_drafter
from specdec.target import CausalLM
from specdec.types import Sampling, Stats

__all__ = ["AUTO_MAX", "Contender", "Run", "run_bench"]

AUTO_MAX = 12  # the longest draft `k=auto` may grow to


@dataclass(frozen=True)
class Contender:
    """One row of the bench: a specdec drafter at one k, plain decoding, or a transformers peer."""

    label: str
    drafter: str | None = None  # registered drafter name; None: plain decoding or a peer
    options: dict[str, Any] = field(default_factory=dict)
    k: int | str = 0  # draft length, or "auto"
    peer: str | None = None  # a transformers peer ("hf-plain", ...)
    tree: bool = False  # whether the drafter's options make it draft token trees
    compile: bool = False  # specdec's compiled engine (`generate(..., compile=True)`)
    baseline: str = "plain"  # the label of the plain row its speedup divides by (the same engine's)

    @property
    def engine(self) -> str:
        return "compiled" if self.compile else "eager"


@dataclass(frozen=True)
class Run:
    """One contender on one turn of one question in one round."""

    contender: str
    question: str
    category: str
    turn: int
    repeat: int
    stats: Stats  # wall_seconds without the compilation the call triggered, if any
    tokens: list[int]
    draft_lengths: tuple[int, ...] = ()  # per step, for k=auto
    compile_seconds: float = 0.0  # torch.compile time spent inside this call (graphs met for the first time)


def _drafter(contender: Contender) -> Any:
    """The contender's drafter, made once and reused for every run (its prefill resets it): a
    drafter's compiled steps stay with its modules, so every run after the first replays them."""
    drafter: Any = make_drafter(contender.drafter, **contender.options)  # type: ignore[arg-type]
    return AdaptiveDraftLength(drafter) if contender.k == "auto" else drafter


def _specdec(target: CausalLM, prompt: torch.Tensor, contender: Contender, drafter: Any, max_new_tokens: int,
             sampling: Sampling, seed: int) -> tuple[list[int], Stats, tuple[int, ...]]:
    if contender.drafter is None:
        result = generate(target, prompt, None, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                          compile=contender.compile)
        return result.tokens, result.stats, ()
    k = AUTO_MAX if contender.k == "auto" else contender.k
    result = generate(target, prompt, drafter, num_draft_tokens=int(k), max_new_tokens=max_new_tokens,
                      sampling=sampling, seed=seed, compile=contender.compile)
    return result.tokens, result.stats, tuple(getattr(drafter, "history", ()))


def run_bench(model: PreTrainedModel, prompt_ids: Callable[[tuple[str, ...], list[str], int], list[int]],
              decode: Callable[[list[int]], str],
              questions: Sequence[Question], contenders: Sequence[Contender], sampling: Sampling,
              max_new_tokens: int, repeats: int, warmup: int, seed: int = 0,
              assistant: PreTrainedModel | None = None, advance: Callable[[], None] = lambda: None
              ) -> tuple[list[Run], dict[str, float]]:
    """All recorded runs, and the seconds each contender spent compiling over all rounds (warm-up
    included); `advance` is called after each run (for a progress bar).

    `prompt_ids(turns, answers, index)` gives the ids of turn `index` after the earlier answers.
    """
    if not contenders or contenders[0].label != "plain":
        raise ValueError("the first contender must be plain decoding (the baseline)")
    target = CausalLM(model)
    runs: list[Run] = []
    compiled: dict[str, float] = {}
    drafters: dict[str, Any] = {}
    for round_index in range(-warmup, repeats):
        for question in questions:
            answers: list[str] = []
            for turn in range(len(question.turns)):
                prompt = torch.tensor(prompt_ids(question.turns, answers, turn), dtype=torch.long)
                plain_tokens: list[int] = []
                for contender in contenders:
                    run_seed = seed + 1000 * max(round_index, 0) + turn
                    compiling = compile_seconds()
                    if contender.peer is not None:
                        tokens, stats = hf_generate(model, prompt, contender.peer, int(contender.k), max_new_tokens,
                                                    sampling, assistant)
                        lengths: tuple[int, ...] = ()
                    else:
                        if contender.drafter is not None and contender.label not in drafters:
                            drafters[contender.label] = _drafter(contender)
                        tokens, stats, lengths = _specdec(target, prompt, contender, drafters.get(contender.label),
                                                          max_new_tokens, sampling, run_seed)
                    if contender.label == "plain":
                        plain_tokens = tokens
                    compiling = compile_seconds() - compiling
                    if round_index >= 0:
                        decoding = replace(stats, wall_seconds=max(stats.wall_seconds - compiling, 0.0))
                        runs.append(Run(contender.label, question.id, question.category, turn, round_index, decoding,
                                        tokens, lengths, compiling))
                    compiled[contender.label] = compiled.get(contender.label, 0.0) + compiling
                    advance()
                answers.append(decode(plain_tokens))
    return runs, compiled
