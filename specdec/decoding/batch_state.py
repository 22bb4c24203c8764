"""The state of a batch decode (`specdec.generate_batch`): each row's generation, the batch's own
counters and layout cache, and a row's draft once checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.decoding.counters import Counters
from specdec.processing.pipeline import Pipeline
from specdec.protocols import DraftContext, Drafter
from specdec.runtime.batch_target import BatchLM
from specdec.runtime.target import CausalLM
from specdec.types import Draft, Engine, Sampling
from specdec.verifier import DEFAULT_RULE

__all__ = ["BatchRun", "Checked", "Row", "live_rows"]


@dataclass
class Row:
    """One prompt's generation. `tokens` holds the committed ids in [0, length), then scratch."""

    index: int
    tokens: torch.Tensor
    prompt_length: int
    generator: torch.Generator
    counters: Counters
    length: int = 0
    produced: int = 0
    done: bool = False
    ctx: DraftContext | None = None
    wall_seconds: float = 0.0
    pipeline: Pipeline | None = None  # the row's sampling pipeline (its own prefix, its own constraint state)


@dataclass
class BatchRun:
    """The state of one batch. `slots[s]`: the row in batch slot s of the target's cache (None
    for a slot kept only to hold the batch at its compiled shape)."""

    target: BatchLM
    lm: CausalLM
    drafter: Any  # the batched protocol (`specdec.decoding.batch_drafters`), or None for plain decoding
    declared: Drafter | None  # the drafter whose declarations hold (hidden layers, tree budget)
    name: str
    k: int
    max_new_tokens: int
    sampling: Sampling
    stop: frozenset[int]
    engine: Engine
    rows: list[Row]
    buckets: bool  # compiled: the batch shrinks to powers of two
    slots: list[int | None] = field(default_factory=list)
    layers: tuple[int, ...] = ()
    steps: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    layouts: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    verify_rule: str = DEFAULT_RULE  # the verification rule (`specdec.verifier.rules`)
    tokenizer: Any = None  # the target's, when the caller gave it (`DraftContext.tokenizer`)


@dataclass(frozen=True)
class Checked:
    """A row's draft after the checks: its parents (None for a chain) and, for a chain whose
    values were not read yet, their fault flag (0-d, read with the verdict)."""

    draft: Draft
    parents: list[int] | None
    faults: torch.Tensor | None
    own: bool = True  # under ranks: this rank's draft is the leader's (it can decide the row's verdict)


def live_rows(run: BatchRun) -> list[tuple[int, Row]]:
    """(batch slot, row) of every row still decoding."""
    return [(slot, run.rows[index]) for slot, index in enumerate(run.slots)
            if index is not None and not run.rows[index].done]
