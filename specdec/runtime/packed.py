"""Packed weights: a CPU step compiled with its model's weights frozen into the graph and every
matrix product through inductor's C++ GEMM template (`docs/engine.md`, *Packed weights*).

A decode step of a model whose weights do not fit the caches reads every weight once per step, so
its speed is the speed at which its matrix products stream weights. torch's default float32
product reads them at about a third of the machine's bandwidth, one row or five; the template on
frozen weights, packed for its micro-kernels, at about two thirds. Such a graph holds the weights
it was compiled with (a packed copy), so it is kept on the module it runs, never shared with
another instance of the same structure as the engine's other graphs are (`specdec.runtime.engine`),
and a change to the weights after it compiled is not seen.

A step packs on CPU when its owner (a target, a draft model) holds at least `PACKED_MIN_BYTES` of
weights, smaller ones sitting in the caches where packing gains nothing and costs a longer compile
(a drafter head that also runs the target's LM head stays unpacked, so a drafter made per request
shares the last one's graphs), or as `PACKED_ENV` says: "1" always, "0" never.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["PACKED_ATTRIBUTE", "PACKED_ENV", "PACKED_MIN_BYTES", "packed_step", "packs_weights"]

PACKED_ENV = "SPECDEC_PACKED_WEIGHTS"  # "1": CPU steps always pack their weights, "0": never, unset: by size
PACKED_MIN_BYTES = 64 * 2**20  # an owner's weights from which its steps pack them (past a server CPU's last cache)
_UNPINNED: weakref.WeakSet[Any] = weakref.WeakSet()  # caches `_unpin` has cleared, once each
PACKED_ATTRIBUTE = "_specdec_packed_steps"  # an owner's packed graphs, held by the owner itself (`_PackedSteps`)


def packs_weights(device: torch.device, modules: tuple[nn.Module, ...]) -> bool:
    """Whether a step running `modules` on `device` compiles with packed weights: on CPU, as
    PACKED_ENV says, else when they hold at least PACKED_MIN_BYTES."""
    if device.type != "cpu":
        return False
    setting = os.environ.get(PACKED_ENV, "")
    if setting not in ("", "0", "1"):
        raise ValueError(f"{PACKED_ENV}={setting!r}: set it to 1 (pack every CPU step's weights), 0 (never) or "
                         "leave it unset (pack the steps of models of at least "
                         f"{PACKED_MIN_BYTES // 2**20} MiB)")
    if setting:
        return setting == "1"
    unique = {id(p): p for module in modules for p in module.parameters()}
    return sum(p.numel() * p.element_size() for p in unique.values()) >= PACKED_MIN_BYTES


class _PackedSteps(dict):  # type: ignore[type-arg]
    """An owner's packed graphs: slot -> `_Packed`. Held as an attribute of the owner, so they live
    and die with it (a graph's closure holds the owner: the cycle is the collector's); a copy or a
    pickle of the owner starts without them."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _PackedSteps:
        return _PackedSteps()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_PackedSteps, ())


class _Packed:
    """`fn(owner, *args)` compiled with packed weights: the modules among the arguments are bound
    into the traced function with the owner (so inductor's freezing sees their weights as
    constants), the other arguments are its inputs. One compiled function per place of the module
    arguments, bound again when another module comes in that place."""

    def __init__(self, fn: Callable[..., Any], options: dict[str, Any], limits: dict[str, Any]) -> None:
        self.fn, self.options, self.limits = fn, options, limits
        self._bound: dict[tuple[int, ...], tuple[list[tuple[int, nn.Module]], Callable[..., Any]]] = {}

    def __call__(self, owner: nn.Module, *args: Any) -> Any:
        import torch._inductor.config as inductor_config

        places = tuple(i for i, arg in enumerate(args) if isinstance(arg, nn.Module))
        held = self._bound.get(places)
        if held is None or any(args[i] is not module for i, module in held[0]):
            fn, modules = self.fn, [(i, args[i]) for i in places]

            def bound(*rest: Any) -> Any:
                merged = list(rest)
                for index, module in modules:
                    merged.insert(index, module)
                return fn(owner, *merged)

            held = self._bound[places] = (modules, torch.compile(bound, fullgraph=True, dynamic=False,
                                                                 options=self.options, **self.limits))
        inputs = [arg for i, arg in enumerate(args) if i not in places]
        for arg in inputs:
            if hasattr(arg, "layers") and arg not in _UNPINNED:  # a cache, met for the first time
                _unpin(arg)
        with inductor_config.patch(freezing=True):  # `options` do not reach it: set for every call (it may compile)
            return held[1](*inputs)


def _unpin(value: Any) -> None:
    """Make a cache's tensors plain inputs of a packed graph. transformers marks a static cache's
    tensors as fixed addresses (`torch._dynamo.mark_static_address`, for CUDA graphs); freezing
    takes such inputs for constants of the graph, as it takes the weights, so a graph compiled
    with one cache would go on reading and writing that cache's tensors when called with another
    of the same shape (a later generation's): wrong tokens, then positions past its end. Without
    the mark they are inputs like any other, guarded by shape alone."""
    for layer in value.layers:
        for held in vars(layer).values():
            for tensor in held if isinstance(held, (list, tuple)) else (held,):
                if isinstance(tensor, torch.Tensor) and hasattr(tensor, "_dynamo_static_input_type"):
                    del tensor._dynamo_static_input_type
    if all(getattr(layer, "is_initialized", True) for layer in value.layers):  # no layer left to allocate (and mark)
        _UNPINNED.add(value)


def packed_step(owner: nn.Module, slot: tuple[Any, ...], fn: Callable[..., Any], options: dict[str, Any],
                limits: dict[str, Any]) -> Callable[..., Any]:
    """The packed graphs of `fn` on `owner` for `slot` (the engine's key of a step), made on first
    use and kept on the owner: called as `step(owner, *args)`."""
    kept = vars(owner).get(PACKED_ATTRIBUTE)
    if kept is None:
        kept = _PackedSteps()
        object.__setattr__(owner, PACKED_ATTRIBUTE, kept)
    if slot not in kept:
        kept[slot] = _Packed(fn, options, limits)
    return kept[slot]
