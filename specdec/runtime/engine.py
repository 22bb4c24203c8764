"""The compiled engine's switch: how one generate call runs its models, and `Step`, a model step
compiled by `torch.compile` or run eagerly.

A step is compiled whole (`fullgraph=True`) for static shapes (`dynamic=False`): one graph per
input shape, which the fixed-shape steps keep to a few per run (the verify padded to k + 1
rows, a tree to its node budget, a drafter's steps likewise). On CUDA the graphs are captured as
CUDA graphs (`mode="reduce-overhead"`); their outputs are copied out, since the next replay
overwrites them. On CPU inductor's C++ wrapper launches the kernels. Graphs are kept by the
structure of the modules they run (`structure`), not by the modules themselves: the weights are
graph inputs, so a later call with the same shapes reuses them, on the same model or drafter
or on a fresh instance of the same structure (a drafter made per request).

On CPU a step of a model too big for the caches compiles with packed weights
(`specdec.runtime.packed`): its graphs hold that model's weights and are kept on it alone.

A step that dynamo or inductor cannot compile warns, naming the reason, and runs eagerly from
then on: the call that failed is run eagerly (a compilation fails before the graph runs, so
nothing ran twice), and an error the eager run raises as well is the step's own, raised as is.
The warning is a `CompileFallbackWarning`. To make a fallback fatal instead, filter it as an error
(`warnings.simplefilter("error", CompileFallbackWarning)`), or set `SPECDEC_STRICT_COMPILE=1` in
the environment, which also reaches subprocesses (`PYTHONWARNINGS` cannot name a package's class):
the compiled engine's tests do (`strict_compile` in tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import os
import types
import warnings
import weakref
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

import torch
from torch import nn

from specdec.runtime.cache import set_static_length
from specdec.runtime.packed import PACKED_ATTRIBUTE, packed_step, packs_weights

__all__ = ["STRICT_ENV", "CompileFallbackWarning", "Step", "compile_failures", "compile_seconds", "fed_step",
           "step_for", "structure"]

RECOMPILE_LIMIT = 64  # graphs per step of one module: its input shapes
STRICT_ENV = "SPECDEC_STRICT_COMPILE"  # "1": a step that cannot compile raises CompileFallbackWarning
_FAILED: dict[tuple[Any, ...], str] = {}  # (step name, owner class) -> why it did not compile
_COMPILED: dict[tuple[Any, ...], Callable[..., Any]] = {}  # compiled steps, by function and structure
_STRUCTURES: weakref.WeakKeyDictionary[nn.Module, tuple[Any, ...]] = weakref.WeakKeyDictionary()


class CompileFallbackWarning(UserWarning):
    """A step asked to compile runs eagerly: dynamo or inductor could not compile it, in this call
    or an earlier one of this process. Filtered as an error, or with STRICT_ENV set, the fallback
    raises it instead (after the call's eager run): a test of the compiled engine fails when
    nothing compiled."""


def _fall_back(message: str) -> None:
    """Warn that a step runs eagerly, or raise the warning where STRICT_ENV is set."""
    if os.environ.get(STRICT_ENV, "") not in ("", "0"):
        raise CompileFallbackWarning(f"{message} ({STRICT_ENV} is set, so this is an error)")
    warnings.warn(message, CompileFallbackWarning, stacklevel=4)


def _recompile_limits() -> dict[str, Any]:
    """`torch.compile`'s per-function recompile limit, where this torch takes one (2.13 on); before
    it, dynamo's process-wide limit is raised to it instead, so a step's input shapes still fit."""
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        return {"recompile_limit": RECOMPILE_LIMIT, "isolate_recompiles": True}
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # (before 2.7)
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), RECOMPILE_LIMIT))
    return {}


def compile_seconds() -> float:
    """Seconds torch.compile has spent in this process so far (dynamo and inductor), for
    reporting compilation apart from decoding."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:  # a torch without the metric
        return 0.0
    return float(sum(compilation_time_metrics.get("_compile.compile_inner", [])))


def compile_failures() -> dict[tuple[Any, ...], str]:
    """The steps that could not be compiled in this process, and why (for diagnostics and tests)."""
    return dict(_FAILED)


def _options(device: torch.device, packed: bool = False) -> dict[str, Any]:
    """Inductor's options for a step: CUDA graphs on CUDA; on CPU the C++ wrapper (less Python per
    call), built apart from the kernels so the wrapper compiles at -O1 (a 32-layer target's graph
    compiles in a third of the time and runs as fast); and no guards on module attributes (see
    `Step`), which cost a tenth of a small step. `packed`: every matrix product through inductor's
    C++ GEMM template, its only backend (`specdec.runtime.packed`), with nothing fused into its
    epilogue: the template's fused epilogues compute a 5-row product's rows otherwise than a one-row
    product's (SmolLM2 int8: a decoder layer's output 0.047 apart, 0.0 without them), and a verify
    row must be a one-row step."""
    options: dict[str, Any] = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
    if device.type == "cuda":
        options["triton.cudagraphs"] = True
    else:
        options.update({"cpp_wrapper": True, "cpp_wrapper_build_separate": True})
    if packed:
        options.update({"max_autotune": True, "max_autotune_gemm_backends": "CPP",  # freezing: `packed_step`
                        "epilogue_fusion": False})
    return options


class Step:
    """`fn(owner, *args)` compiled for static shapes, or run eagerly when `enabled` is false or
    compiling failed.

    `owner` is the module the step runs (a model, a drafter head). The compiled graphs are kept
    by `name`, `fn`, the owner's dtype and device, the owner's `structure` and that of any other
    module the step takes as an argument (`uses`, e.g. a target's LM head in a drafter's draft
    loop): every Step of an owner of that structure shares them, across calls and across
    instances, and no module of another structure ever runs them. They skip dynamo's guards on
    module attributes (checking those costs more than a small model's step), which is sound
    because the structure holds everything a graph reads from a module but its tensors' values,
    and those are graph inputs. The modules' weights may change in place; their configuration
    must not once they have compiled. A step with packed weights (`packed`, CPU,
    `specdec.runtime.packed`) is the exception: its graphs hold the weights of the modules it runs
    as they were when they compiled, and are kept on its owner alone.

    `restore`, when given, puts back whatever state a failed compiled call may have touched
    before the call is run eagerly (a cache's length).
    """

    def __init__(self, fn: Callable[..., Any], name: str, enabled: bool, owner: nn.Module,
                 uses: tuple[nn.Module, ...] = (), restore: Callable[[], None] | None = None) -> None:
        self.fn, self.name, self.owner, self.restore = fn, name, owner, restore
        first = next(owner.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
        self.key = (name, type(owner).__name__)
        self.cuda_graphs = enabled and device.type == "cuda"
        self.packed = False  # compiled with packed weights (set below)
        self._compiled: Callable[..., Any] | None = None
        if enabled and self.key in _FAILED:
            _fall_back(f"specdec: cannot compile {self.name} ({_FAILED[self.key][:300]}); it runs eagerly")
        elif enabled:
            import torch._dynamo.config as dynamo_config

            if hasattr(dynamo_config, "accumulated_recompile_limit"):  # (2.6 on)
                dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 4096)
            slot = (name, fn.__module__, fn.__qualname__, None if first is None else first.dtype, device,
                    structure(owner), tuple(structure(module) for module in uses))
            # by the owner's own weights: a drafter head that also runs the target's LM head stays
            # unpacked, so a drafter made per request shares its graphs with the last one
            self.packed = packs_weights(device, (owner,))
            if self.packed:  # the graph holds these modules' weights: kept for them alone
                self._compiled = packed_step(owner, slot, fn, _options(device, True), _recompile_limits())
            else:
                if slot not in _COMPILED:
                    _COMPILED[slot] = torch.compile(fn, fullgraph=True, dynamic=False, options=_options(device),
                                                    **_recompile_limits())
                self._compiled = _COMPILED[slot]

    @property
    def compiled(self) -> bool:
        """Whether calls run the compiled graphs."""
        return self._compiled is not None

    def __call__(self, *args: Any) -> Any:
        if self._compiled is None:
            return self.fn(self.owner, *args)
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        try:
            out = self._compiled(self.owner, *args)
        except Exception as error:  # dynamo and inductor raise many kinds; an eager run tells which it was
            if self.restore is not None:
                self.restore()
            out = self.fn(self.owner, *args)  # a real error in `fn` is raised here, uncompiled
            reason = " ".join(str(error).split("\n")[0].split()) or type(error).__name__
            _FAILED[self.key] = f"{type(error).__name__}: {reason[:300]}"
            self._compiled = None
            _fall_back(f"specdec: cannot compile {self.name} ({_FAILED[self.key]}); it runs eagerly")
            return out
        return _clone(out) if self.cuda_graphs else out


def step_for(steps: dict[tuple[Any, ...], Step], fn: Callable[..., Any], name: str, enabled: bool, owner: nn.Module,
             args: tuple[Any, ...], restore: Callable[[], None] | None = None) -> Step:
    """The Step of `fn` for these arguments among `steps` (made on first use): one per function
    and per structure of the modules among `args` (a drafter's loop takes the target's LM head)."""
    uses = tuple(arg for arg in args if isinstance(arg, nn.Module))
    key = (fn.__module__, fn.__qualname__, tuple(structure(module) for module in uses))
    if key not in steps:
        steps[key] = Step(fn, name, enabled, owner, uses, restore)
    return steps[key]


_FED: dict[tuple[Callable[..., Any], Callable[..., Any]], Callable[..., Any]] = {}  # (feed, loop) -> their step


def fed_step(feed: Callable[..., Any], loop: Callable[..., Any]) -> Callable[..., Any]:
    """The one step of a feed and a drafter's loop after it:
    `run(owner, cache, where, inputs, *args)` runs `feed(owner, cache, where, inputs)` over the
    padded rows (it returns the output at the last real row, where[1]), rolls a static cache back to
    the real rows (where[0]), so the loop overwrites the padding, then returns
    `loop(owner, cache, output, *args)`. Made once per pair, so `step_for` keeps one Step for it."""
    key = (feed, loop)
    if key not in _FED:

        def run(owner: nn.Module, cache: Any, where: torch.Tensor, inputs: Any, *args: Any) -> Any:
            out = feed(owner, cache, where, inputs)
            set_static_length(cache, where[0])
            return loop(owner, cache, out, *args)

        run.__qualname__ = f"fed[{feed.__qualname__}, {loop.__module__}.{loop.__qualname__}]"
        _FED[key] = run
    return _FED[key]


def structure(module: nn.Module) -> tuple[Any, ...]:
    """What a compiled graph may read from `module` but its tensors' values, for every submodule:
    its class, its parameters', buffers' and tensor attributes' names, shapes, dtypes and devices,
    and its other attributes (numbers, strings, configs by their contents, functions by name).
    An attribute of another kind is taken by identity, so modules holding one share no graph.
    Computed once per module: a module's configuration must not change once it has compiled."""
    known = _STRUCTURES.get(module)
    if known is None:
        known = tuple((name, type(sub).__module__, type(sub).__qualname__,
                       tuple(sorted((key, _attribute(value)) for key, value in vars(sub).items()
                                    if key not in _MODULE_FIELDS)))
                      for name, sub in module.named_modules(remove_duplicate=False))
        known += (tuple((name, tuple(t.shape), t.dtype, t.device) for name, t in
                        [*module.named_parameters(remove_duplicate=False),
                         *module.named_buffers(remove_duplicate=False)]),)
        _STRUCTURES[module] = known
    return known


# nn.Module's own bookkeeping: its tensors and submodules are walked by name, its hooks must be
# empty under compile (dynamo reads them) and are compared by count
_MODULE_FIELDS = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", PACKED_ATTRIBUTE})


def _attribute(value: Any) -> Any:
    """A module attribute as a graph may depend on it (`structure`)."""
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return value
    if isinstance(value, (PurePath, enum.Enum)):
        return (type(value).__qualname__, str(value))
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device)
    if isinstance(value, (tuple, list, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return (type(value).__name__, tuple(_attribute(item) for item in items))
    if isinstance(value, dict):  # a hook table's keys are handle numbers, counted per process: its order holds
        return ("dict", tuple((key if isinstance(key, str) else None, _attribute(item)) for key, item in
                              sorted(value.items(), key=lambda pair: repr(pair[0]))))
    if isinstance(value, nn.Module):  # walked as a submodule when registered; else by identity
        return ("module", id(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__qualname__, _attribute(dataclasses.asdict(value)))
    if callable(getattr(value, "to_dict", None)) and hasattr(value, "to_json_string"):  # a transformers config
        return (type(value).__qualname__, value.to_json_string(use_diff=False))
    if isinstance(value, types.FunctionType):  # by its code and what it closes over (a hook made per module)
        return ("function", id(value.__code__), tuple(_attribute(cell.cell_contents) for cell in value.__closure__ or ()))
    if isinstance(value, type):
        return ("class", id(value))
    return ("object", type(value).__qualname__, id(value))


def _clone(out: Any) -> Any:
    """A copy of every tensor in `out`: the next CUDA-graph replay overwrites the outputs."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(_clone(item) for item in out)
    return out
