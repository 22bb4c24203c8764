"""The state of one generation: what its rows share (`Plan`, fixed), each row's own progress
(`Row`), and the run that ties them to the target, the drafter and the ranks (`Run`). A batch
of one is a run of one row."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.decoding.counters import Counters
from specdec.distributed.agreement import Agreement
from specdec.processing.pipeline import Pipeline
from specdec.protocols import DraftContext, Drafter
from specdec.runtime.rows import RowsTarget
from specdec.runtime.target import CausalLM
from specdec.teaching.trace import Trace
from specdec.types import Engine, Sampling

__all__ = ["Plan", "Row", "Run"]


@dataclass(frozen=True)
class Plan:
    """What every row of a generation shares: the drafter's name (for errors), the loop's k, the
    budget, the sampling settings, the stop ids (and on the device, [S]), the engine, the
    verification rule, the target's tokenizer (when given) and the target layers the drafter reads."""

    name: str
    k: int
    max_new_tokens: int
    sampling: Sampling
    stop_ids: frozenset[int]
    stop: torch.Tensor | None
    engine: Engine
    verify_rule: str
    tokenizer: Any = None
    layers: tuple[int, ...] = ()


@dataclass
class Row:
    """One prompt's generation. `tokens` [prompt + max_new_tokens + verify rows] holds the committed
    ids in [0, length), then scratch; the target's cache holds all of them but the last."""

    index: int
    tokens: torch.Tensor
    prompt_length: int
    generator: torch.Generator
    pipeline: Pipeline
    counters: Counters
    trace: Trace | None = None
    length: int = 0
    produced: int = 0
    done: bool = False
    ctx: DraftContext | None = None
    wall_seconds: float = 0.0

    @property
    def committed(self) -> torch.Tensor:
        """LongTensor [length]: the prompt and the accepted output."""
        return self.tokens[: self.length]


@dataclass
class Run:
    """One generation: the target of its rows, the drafter (None: plain decoding), what the rows
    share, the rows, and which row each slot of the target holds (`slots[s]`; None for a slot
    kept only to hold a compiled batch shape). `agreement` makes ranks of a sharded target take
    the leader's drafts and verdicts (`specdec.distributed.agreement`)."""

    target: RowsTarget
    lm: CausalLM
    drafter: Drafter | None
    plan: Plan
    rows: list[Row]
    agreement: Agreement
    buckets: bool = False  # compiled batches shrink to powers of two, keeping a few graph shapes
    slots: list[int | None] = field(default_factory=list)
    steps: int = 0
    draft_seconds: float = 0.0
    recorded_draft_seconds: float = 0.0  # the part of draft_seconds already shared out to the rows
    verify_seconds: float = 0.0
    warned: set[str] = field(default_factory=set)  # the warnings given once per generation
    start: float = field(default_factory=time.perf_counter)

    def live(self) -> list[tuple[int, Row]]:
        """(slot, row) of every row still decoding."""
        return [(slot, self.rows[index]) for slot, index in enumerate(self.slots)
                if index is not None and not self.rows[index].done]
