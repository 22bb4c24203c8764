"""What the decode loops ask of a drafter beyond its draft: calling it, with whatever it raises
reported as a `specdec.verifier.DraftError` naming it; the hidden-state layers it reads; and the
size a tree draft may reach. Both loops (`specdec.decoding.loop`, `specdec.decoding.batch_loop`)
use these, so a drafter fails the same way in a batch as alone."""

from __future__ import annotations

from typing import Any

import torch

from specdec.protocols import Drafter
from specdec.runtime.forward import LAST_LAYER
from specdec.runtime.target import CausalLM
from specdec.types import Engine
from specdec.verifier import DraftError

__all__ = ["call_drafter", "check_tree_size", "hidden_layers"]


def call_drafter(drafter: Any, name: str, method: str, *args: Any) -> Any:
    """`drafter.method(*args)`; whatever it raises comes back as a DraftError naming the drafter and
    the method, the original chained (running out of memory excepted: that is no drafter's fault)."""
    try:
        return getattr(drafter, method)(*args)
    except (DraftError, MemoryError, torch.OutOfMemoryError):  # out of memory is no drafter's fault
        raise
    except Exception as error:
        raise DraftError(f"drafter {name!r} raised in {method}: {type(error).__name__}: {error}") from error


def hidden_layers(drafter: Drafter | None, name: str, lm: CausalLM) -> tuple[int, ...]:
    """The target layers whose hidden states `drafter` reads: none, the post-norm last layer (-1)
    for `uses_hidden_states`, or those its `hidden_layers(target)` names (indices 0..num_layers)."""
    if not getattr(drafter, "uses_hidden_states", False):
        return ()
    if lm.hidden_obstacle is not None:
        raise DraftError(f"drafter {name!r} reads the target's hidden states, but {type(lm.model).__name__} "
                         f"returns none: {lm.hidden_obstacle}")
    if not hasattr(drafter, "hidden_layers"):
        return (LAST_LAYER,)
    layers = tuple(call_drafter(drafter, name, "hidden_layers", lm))
    if not layers or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= lm.num_layers
                         for i in layers):
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
                         f"{engine.draft_nodes}; declare the largest tree it drafts (max_draft_nodes)")
