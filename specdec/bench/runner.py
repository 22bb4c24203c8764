"""Running the bench: every contender on every question turn, repeats interleaved, plain
decoding of the same target first in each round (its answers are the multi-turn context for
every contender, so all contenders see identical prompts). After the recorded rounds, rows whose
timings still spread too widely get more rounds, up to a limit (`repeat_rounds`).

Batch 1, prefill included in the timings, warm-up rounds not recorded: Spec-Bench's protocol.
Compilation is kept apart: the seconds torch.compile spent inside a call are taken off its
time and reported on their own (the warm-up round meets most graphs first).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import PreTrainedModel

from specdec.bench.llama_cpp import LLAMA_CPP, llama_cpp_generate
from specdec.bench.peers import hf_generate
from specdec.bench.questions import Question
from specdec.decoding.auto_draft import AUTO_DRAFT_MAX, AutoDraft
from specdec.decoding.generate import generate
from specdec.plugins import make_drafter
from specdec.protocols import forget
from specdec.runtime.engine import compile_seconds
from specdec.runtime.target import CausalLM
from specdec.types import Sampling, Stats
from specdec.verifier import DEFAULT_RULE

__all__ = ["AUTO_MAX", "Contender", "Run", "repeat_rounds", "run_bench"]

AUTO_MAX = AUTO_DRAFT_MAX  # the longest draft `k=auto` may grow to (`generate(num_draft_tokens="auto")`'s)


@dataclass(frozen=True)
class Contender:
    """One row of the bench: a specdec drafter at one k, plain decoding, or a transformers peer."""

    label: str
    drafter: str | None = None  # registered drafter name; None: plain decoding or a peer
    options: dict[str, Any] = field(default_factory=dict)
    k: int | str = 0  # draft length, or "auto"
    peer: str | None = None  # a transformers peer ("hf-plain", ...) or llama.cpp (options: its "file")
    tree: bool = False  # whether the drafter's options make it draft token trees
    compile: bool = False  # specdec's compiled engine (`generate(..., compile=True)`)
    baseline: str = "plain"  # the label of the plain row its speedup divides by (the same engine's)
    verify_rule: str = DEFAULT_RULE  # the verification rule (`specdec.verifier.rules`)

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
    return AutoDraft(drafter) if contender.k == "auto" else drafter


def _specdec(target: CausalLM, prompt: torch.Tensor, contender: Contender, drafter: Any, max_new_tokens: int,
             sampling: Sampling, seed: int, tokenizer: Any) -> tuple[list[int], Stats, tuple[int, ...]]:
    if contender.drafter is None:
        result = generate(target, prompt, None, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                          compile=contender.compile, tokenizer=tokenizer)
        return result.tokens, result.stats, ()
    k = AUTO_MAX if contender.k == "auto" else contender.k
    result = generate(target, prompt, drafter, num_draft_tokens=int(k), max_new_tokens=max_new_tokens,
                      sampling=sampling, seed=seed, compile=contender.compile, tokenizer=tokenizer,
                      verify_rule=contender.verify_rule)
    return result.tokens, result.stats, tuple(getattr(drafter, "history", ()))


def repeat_rounds(contenders: Sequence[Contender], one_round: Callable[[int, Sequence[Contender]], list[Run]],
                  repeats: int, warmup: int, max_repeats: int, noisy: Callable[[Sequence[Run]], Collection[str]]
                  ) -> list[Run]:
    """Run `warmup` unrecorded rounds (indices -warmup..-1) and `repeats` rounds of every
    contender, then, while `noisy(the runs so far)` names contenders and fewer than `max_repeats`
    rounds ran, one more round of those contenders and of plain decoding (every row's baseline
    and the multi-turn answers); returns the recorded runs. `one_round(index, contenders)` runs
    one round and returns its runs (none for a warm-up round)."""
    if max_repeats < repeats:
        raise ValueError(f"max_repeats must be >= repeats ({repeats}), got {max_repeats}")
    for index in range(-warmup, 0):
        one_round(index, contenders)
    runs: list[Run] = []
    for index in range(max_repeats):
        chosen = contenders
        if index >= repeats:
            wide = set(noisy(runs))
            if not wide:
                break
            chosen = [c for c in contenders if c.label in wide or (c.drafter is None and c.peer is None)]
        runs += one_round(index, chosen)
    return runs


def run_bench(model: PreTrainedModel, prompt_ids: Callable[[tuple[str, ...], list[str], int], list[int]],
              decode: Callable[[list[int]], str],
              questions: Sequence[Question], contenders: Sequence[Contender], sampling: Sampling,
              max_new_tokens: int, repeats: int, warmup: int, seed: int = 0,
              assistant: PreTrainedModel | None = None, advance: Callable[[], None] = lambda: None,
              max_repeats: int | None = None, noisy: Callable[[Sequence[Run]], Collection[str]] = lambda runs: (),
              tokenizer: Any = None) -> tuple[list[Run], dict[str, float]]:
    """All recorded runs, and the seconds each contender spent compiling over all rounds (warm-up
    included); `advance` is called after each run (for a progress bar).

    `prompt_ids(turns, answers, index)` gives the ids of turn `index` after the earlier answers.
    Question i's turn t samples with seed + i + 100003 t (i: its `number` when it has one) in
    every round, so the rounds decode the same tokens and differ in time only.
    `noisy(runs)` names the contenders still too noisy for the rounds run (`repeat_rounds`);
    max_repeats: the most recorded rounds (None: exactly `repeats`). `tokenizer`: the target's, for
    a constraint in `sampling`.
    """
    if not contenders or contenders[0].label != "plain":
        raise ValueError("the first contender must be plain decoding (the baseline)")
    target = CausalLM(model)
    compiled: dict[str, float] = {}
    drafters: dict[str, Any] = {}

    def one_round(round_index: int, chosen: Sequence[Contender]) -> list[Run]:
        runs: list[Run] = []
        for drafter in drafters.values():  # memory across calls spans one round's questions, not rounds
            forget(drafter)
        for number, question in enumerate(questions):
            answers: list[str] = []
            for turn in range(len(question.turns)):
                prompt = torch.tensor(prompt_ids(question.turns, answers, turn), dtype=torch.long)
                plain_tokens: list[int] = []
                for contender in chosen:
                    place = number if question.number is None else question.number
                    run_seed = seed + place + 100_003 * turn  # the same draws every round: rounds differ in time only
                    compiling = compile_seconds()
                    if contender.peer == LLAMA_CPP:
                        tokens, stats = llama_cpp_generate(contender.options["file"], prompt, max_new_tokens, sampling,
                                                           run_seed)
                        lengths: tuple[int, ...] = ()
                    elif contender.peer is not None:
                        tokens, stats = hf_generate(model, prompt, contender.peer, int(contender.k), max_new_tokens,
                                                    sampling, assistant)
                        lengths = ()
                    else:
                        if contender.drafter is not None and contender.label not in drafters:
                            drafters[contender.label] = _drafter(contender)
                        tokens, stats, lengths = _specdec(target, prompt, contender, drafters.get(contender.label),
                                                          max_new_tokens, sampling, run_seed, tokenizer)
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
        return runs

    runs = repeat_rounds(contenders, one_round, repeats, warmup, repeats if max_repeats is None else max_repeats,
                         noisy)
    return runs, compiled
