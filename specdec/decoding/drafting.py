"""What the decode loop asks of a drafter, in one place: each row's context, calling the drafter
(whatever it raises is reported as a `specdec.verifier.DraftError` naming it and the method), the
target layers it reads, and the one check every draft passes before it is verified.

A draft is checked as it is laid out: its shape, dtype, device and id range on the host at once;
a chain's values (ids and q rows) on the device, read back with the verdict in the step's one
transfer (`Checked.faults`); a tree's values now, since its walk runs on the host. A target that
cannot run trees verifies a tree's first-child path (warned once per generation); one that cannot
run a drafter's extra rows drops them (warned once). A broken draft names the drafter and, in a
batch, the row.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from dataclasses import dataclass, replace
from typing import Any

import torch

from specdec.decoding.run import Row, Run
from specdec.protocols import Capability, DraftContext, Drafter, declares
from specdec.runtime.forward import LAST_LAYER
from specdec.runtime.target import CausalLM
from specdec.trees import depths, first_path
from specdec.types import Draft, Engine
from specdec.verifier import DraftError, draft_faults, validate_draft

__all__ = ["Checked", "call", "check_tree_size", "context", "drafts", "hidden_layers"]


@dataclass(frozen=True)
class Checked:
    """A row's draft after the checks. parents: None for a chain; nodes: the draft node behind
    each chain position after a tree was cut to its first path; faults: 0-d, whether a chain's
    values break the contract (read with the verdict); own: under ranks, whether this rank's draft
    was the leader's (so this rank can decide the row's verdict)."""

    draft: Draft
    parents: list[int] | None = None
    nodes: list[int] | None = None
    faults: torch.Tensor | None = None
    own: bool = True

    @property
    def reached(self) -> int:
        """The depth the draft reaches: its deepest node's, or a chain's length."""
        return max(depths(self.parents), default=0) if self.parents is not None else self.draft.tokens.shape[0]


def context(run: Run, row: Row, slot: int, hidden: torch.Tensor | None, accepted: tuple[int, ...],
            extra_logits: torch.Tensor | None = None) -> DraftContext:
    """Row `row`'s DraftContext now: its committed ids, its own generator and pipeline, the hidden
    states the target gave since the last step, the nodes just accepted, its extra rows' logits, and
    the slot of the target that holds it."""
    plan = run.plan
    return DraftContext(tokens=row.committed, sampling=plan.sampling, generator=row.generator, target=run.lm,
                        vocab_size=run.lm.vocab_size, hidden_states=hidden, accepted=accepted, engine=plan.engine,
                        extra_logits=extra_logits, budget=plan.max_new_tokens - row.produced,
                        pipeline=row.pipeline, tokenizer=plan.tokenizer, target_rows=run.target, slot=slot)


def call(drafter: Any, name: str, method: str, *args: Any) -> Any:
    """`drafter.method(*args)`; whatever it raises comes back as a DraftError naming the drafter and
    the method, the original chained (running out of memory excepted: that is no drafter's fault)."""
    try:
        return getattr(drafter, method)(*args)
    except (DraftError, MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as error:
        raise DraftError(f"drafter {name!r} raised in {method}: {type(error).__name__}: {error}") from error


def hidden_layers(drafter: Drafter | None, name: str, lm: CausalLM) -> tuple[int, ...]:
    """The target layers whose hidden states `drafter` reads (`Capability.HIDDEN_STATES`): none, or
    those its `hidden_layers(target)` names (indices 0..num_layers, or LAST_LAYER)."""
    if drafter is None or not declares(drafter, Capability.HIDDEN_STATES):
        return ()
    if lm.hidden_obstacle is not None:
        raise DraftError(f"drafter {name!r} reads the target's hidden states, but {type(lm.model).__name__} "
                         f"returns none: {lm.hidden_obstacle}")
    layers = tuple(call(drafter, name, "hidden_layers", lm))
    if not layers or any(isinstance(i, bool) or not isinstance(i, int) or not (0 <= i <= lm.num_layers or
                                                                                  i == LAST_LAYER) for i in layers):
        raise DraftError(f"drafter {name!r} asked for hidden states of layers {layers}, but the target has "
                         f"{lm.num_layers} layers: name indices 0..{lm.num_layers} (0 = the embeddings, "
                         f"{lm.num_layers} = the post-norm last layer)")
    return layers


def check_tree_size(name: str, k: int, engine: Engine, parents: list[int]) -> None:
    """Raise a DraftError when a tree holds more nodes than the engine's budget for it."""
    if len(parents) > engine.draft_nodes:
        said = f"its max_draft_nodes({k}) is" if engine.declared else \
            "a drafter that declares no max_draft_nodes(k) may draft at most"
        raise DraftError(f"drafter {name!r} returned a tree of {len(parents)} nodes, but {said} "
                         f"{engine.draft_nodes}; declare the largest tree it drafts (Capability.TREES)")


def drafts(run: Run) -> tuple[dict[int, Checked], float]:
    """Every live row's draft, checked, keyed by row index, and the seconds the drafter took. Rows
    with one token of budget left draft nothing, and so does every row of plain decoding."""
    plan = run.plan
    if run.drafter is None or plan.k == 0:
        return {}, 0.0
    budgets = {row.index: min(plan.k, plan.max_new_tokens - row.produced - 1) for _, row in run.live()}
    budgets = {index: k for index, k in budgets.items() if k > 0}
    if not budgets:
        return {}, 0.0
    tick = time.perf_counter()
    rows = {index: run.rows[index].ctx for index in budgets}
    proposed = call(run.drafter, plan.name, "propose", rows, budgets)
    seconds = time.perf_counter() - tick
    tampered = run.target.tampered()
    if tampered is not None:
        raise DraftError(f"drafter {plan.name!r} {tampered}; drafters must not run ctx.target.forward")
    checked = {}
    for index, k in budgets.items():
        try:
            checked[index] = check(run, proposed.get(index) if isinstance(proposed, dict) else None, k)
        except DraftError as error:
            raise DraftError(f"{error} (row {index} of the batch)" if len(run.rows) > 1 else str(error)) from error
    return checked, seconds


def check(run: Run, proposed: object, k: int) -> Checked:
    """The checks of one row's draft of at most k tokens (see the module docstring)."""
    plan, target, vocab, device = run.plan, run.target, run.lm.vocab_size, run.lm.device
    if proposed is None:
        raise DraftError(f"drafter {plan.name!r}: propose returned no draft for this row")
    parents = validate_draft(proposed, k, vocab, device, plan.name, values=False, extra_rows=plan.engine.extra_rows)
    assert isinstance(proposed, Draft)
    if parents is not None or proposed.extra is not None:  # walked or laid out on the host: read now
        validate_draft(proposed, k, vocab, device, plan.name, extra_rows=plan.engine.extra_rows)
    if parents is not None:
        check_tree_size(plan.name, plan.k, plan.engine, parents)
    if proposed.extra is not None and target.masked_obstacle is not None:
        _warn_once(run, "extra", f"specdec: {type(run.lm.model).__name__} cannot run the extra rows of drafter "
                                 f"{plan.name!r} in its verify forward: {target.masked_obstacle}; they are dropped "
                                 "(the drafter reads ctx.extra_logits = None)")
        proposed = replace(proposed, extra=None)
    nodes = None
    if parents is not None and target.tree_obstacle is not None:
        _warn_once(run, "tree", f"specdec: {type(run.lm.model).__name__} cannot verify token trees: "
                                f"{target.tree_obstacle}; the trees of drafter {plan.name!r} are verified as chains "
                                "(each tree's first-child path)")
        nodes = first_path(parents)
        probs = None if proposed.probs is None else proposed.probs[nodes]
        proposed, parents = Draft(proposed.tokens[nodes], probs, extra=proposed.extra, forwards=proposed.forwards,
                                  note=proposed.note), None
    faults = draft_faults(proposed, vocab) if parents is None and proposed.tokens.numel() else None
    return Checked(proposed, parents, nodes, faults)


def name_fault(run: Run, index: int, draft: Draft) -> None:
    """Raise the DraftError that names what is wrong with a chain whose faults flag was read set."""
    try:
        validate_draft(draft, run.plan.k, run.lm.vocab_size, run.lm.device, run.plan.name)
    except DraftError as error:
        raise DraftError(f"{error} (row {index} of the batch)" if len(run.rows) > 1 else str(error)) from error
    raise DraftError(f"drafter {run.plan.name!r} returned a broken draft")


def _warn_once(run: Run, key: str, message: str) -> None:
    """Warn once per generation, pointing at the code that called specdec."""
    if key not in run.warned:
        run.warned.add(key)
        warnings.warn(message, stacklevel=_outside_specdec())


_ROOTS = (str(Path(__file__).resolve().parent.parent) + "/",)  # specdec's own files


def _outside_specdec() -> int:
    """The `stacklevel` of the first frame above this call that is not specdec's own code."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_ROOTS):
        frame, level = frame.f_back, level + 1
    return level
