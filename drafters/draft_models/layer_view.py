"""A view of a transformers causal LM that runs a subset of its decoder layers, in order, sharing
every parameter and module with the model (self-speculation by layer skipping: Zhang et al. 2023,
"Draft & Verify: Lossless Large Language Model Acceleration via Self-Speculative Decoding"; Xia
et al. 2025, "SWIFT: On-the-Fly Self-Speculative Decoding for LLM Inference Acceleration"; early
exit, Elhoushi et al. 2024, "LayerSkip").

The view is a shallow copy of each module on the path from the model to its decoder-layer list
(`model.layers`, `transformer.h`, `gpt_neox.layers`, ...): the copies get dictionaries of
submodules of their own, the last one a new ModuleList of the kept layers, so the model itself is
never touched, not even for a moment. The layers are the model's own objects, so each attention
layer keeps its `layer_idx` and reads and writes its own slots of the model's cache. The module
holding the list gets a copy of its config whose per-layer lists (`layer_types`, ...) are those of
the kept layers, for forwards that index them by loop position (Gemma 2, Cohere 2, ...).

Every view is checked on a probe forward (`check_view`): the view must run exactly the kept
layers, once each, in order, and hand each of them the very arguments (masks, rotary tables,
positions) the full forward hands it. transformers' `assistant_early_exit` truncates
`num_hidden_layers` and silently drafts with the whole model where a forward ignores it; a view
that does not follow its list is refused here, by name and reason.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, LinearAttentionCacheLayerMixin

from specdec.runtime.cache import new_cache
from specdec.runtime.forward import is_pipelined
from specdec.runtime.windows import Attention, attention_kinds, layer_masks

__all__ = ["LayerView", "check_view", "crop_layers", "decoder_layers", "layer_view", "view_obstacle"]


@dataclass(frozen=True)
class LayerView:
    """`model`: the view, called as the full model is; `kept`: the indices of the layers it runs
    (ascending) among the `num_layers` of the list at `path`."""

    model: PreTrainedModel
    kept: tuple[int, ...]
    num_layers: int
    path: str

    @property
    def skipped(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if i not in self.kept)

    @property
    def cost(self) -> float:
        """The view's share of the full model's decoder layers (c in the speedup model)."""
        return len(self.kept) / self.num_layers


def num_layers(model: PreTrainedModel) -> int:
    """config.num_hidden_layers of the model's text config."""
    count = getattr(model.config.get_text_config(), "num_hidden_layers", None)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"{type(model).__name__}: config.num_hidden_layers is {count!r}; a layer view needs the "
                         "number of decoder layers")
    return count


def decoder_layers(model: PreTrainedModel) -> str:
    """The path of the model's decoder-layer list: the shallowest ModuleList under its base model
    holding config.num_hidden_layers modules. Raises naming the candidates when there is none or
    several."""
    count = num_layers(model)
    base = model.base_model
    prefix = next((name for name, module in model.named_modules() if module is base), "")
    found = [name for name, module in base.named_modules(prefix=prefix)
             if isinstance(module, nn.ModuleList) and len(module) == count]
    if not found:
        raise ValueError(f"{type(model).__name__} has no ModuleList of {count} modules (config.num_hidden_layers) "
                         f"under its base model {type(base).__name__}; no decoder-layer list to take a view of")
    depth = min(name.count(".") for name in found)
    shallowest = [name for name in found if name.count(".") == depth]
    if len(shallowest) > 1:
        raise ValueError(f"{type(model).__name__} has several lists of {count} modules ({', '.join(shallowest)}); "
                         "cannot tell which holds the decoder layers")
    return shallowest[0]


def view_obstacle(model: PreTrainedModel) -> str | None:
    """Why no view of `model`'s layers can draft exactly over its cache (None when one can)."""
    if is_pipelined(model):
        return ("it is split across pipeline stages or devices (a device_map), whose forwards pass hidden states "
                "between placements a view would have to follow; load it on one device")
    config = model.config.get_text_config()
    if getattr(config, "num_kv_shared_layers", 0):
        return (f"its last {config.num_kv_shared_layers} layers read the keys and values of earlier layers, which "
                "a skipped layer would leave unwritten at the draft's positions")
    if any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in new_cache(model).layers):
        return ("its linear-attention (recurrent) layers keep one running state, which a draft through a subset of "
                "the layers would advance past the committed tokens in some layers and not in others; self-drafting "
                "serves attention-only models")
    return None


def layer_view(model: PreTrainedModel, kept: Sequence[int], check: bool = True) -> LayerView:
    """The view of `model` running only the layers `kept` (indices, in any order; run ascending).

    `check` runs `check_view` on it. Raises ValueError naming the model and the reason when the
    model cannot be served (`view_obstacle`, an instance-level forward on the path) or the indices
    are bad."""
    total = num_layers(model)
    layers = _checked_indices(kept, total)
    obstacle = view_obstacle(model)
    if obstacle is not None:
        raise ValueError(f"{type(model).__name__} cannot draft with a subset of its layers: {obstacle}")
    path = decoder_layers(model)
    parts = path.split(".")
    root = _shallow(model, type(model).__name__)
    parent: nn.Module = root
    for i, part in enumerate(parts[:-1]):
        child = _shallow(parent._modules[part], ".".join(parts[: i + 1]))
        parent._modules[part] = child
        parent = child
    full = model.get_submodule(path)
    parent._modules[parts[-1]] = nn.ModuleList([full[i] for i in layers])
    stack_config = getattr(parent, "config", None)
    if stack_config is not None:
        parent.__dict__["config"] = _view_config(stack_config, layers, total)
    root.__dict__["specdec_kept_layers"] = ",".join(map(str, layers))  # tells compiled steps of two views apart
    view = LayerView(root, layers, total, path)
    if check:
        check_view(model, view)
    return view


def _checked_indices(kept: Sequence[int], total: int) -> tuple[int, ...]:
    if isinstance(kept, (str, bytes)) or not isinstance(kept, Sequence):
        raise ValueError(f"kept layers must be a list of layer indices, got {kept!r}")
    bad = [i for i in kept if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < total]
    if bad or not kept:
        raise ValueError(f"kept layers must be a non-empty list of indices in [0, {total}), got {list(kept)!r}")
    if len(set(kept)) != len(kept):
        raise ValueError(f"kept layers name a layer twice: {list(kept)!r}")
    return tuple(sorted(kept))


def _shallow(module: nn.Module, where: str) -> nn.Module:
    """A shallow copy of `module` with a dictionary of submodules of its own (the modules in it shared)."""
    if "forward" in module.__dict__:
        raise ValueError(f"{where} has its forward replaced on the instance (accelerate's dispatch hooks do this), "
                         "bound to the full model, which a view cannot re-point; load the model without device_map")
    clone = copy.copy(module)
    clone.__dict__["_modules"] = dict(module._modules)
    return clone


def _view_config(config: Any, kept: tuple[int, ...], total: int) -> Any:
    """A copy of `config` for the module holding the kept layers: num_hidden_layers = len(kept), and
    each per-layer list (an attribute named *layer* with one entry per layer) cut to the kept ones."""
    clone = copy.copy(config)
    for name, value in vars(config).items():
        if "layer" in name and isinstance(value, (list, tuple)) and len(value) == total:
            setattr(clone, name, type(value)(value[i] for i in kept))
    clone.num_hidden_layers = len(kept)
    return clone


def check_view(model: PreTrainedModel, view: LayerView) -> None:
    """Run one probe forward of 3 tokens through the model and through the view (no cache) and
    raise ValueError, naming the architecture and what went wrong, unless the full forward runs
    each layer of the list once in order, the view runs exactly the kept layers once in order,
    and each kept layer receives the same arguments, but its hidden states, in both. The probe's
    masks differ by kind of layer (a sliding layer's window is 1 here), so a layer handed
    another kind's mask, or rotary table, is caught."""
    name = type(model).__name__
    full_list = list(model.get_submodule(view.path))
    ids, positions, mask = _probe_inputs(model)
    full = _layer_calls(model, full_list, ids, positions, mask, name)
    order = [index for index, _, _ in full]
    if order != list(range(view.num_layers)):
        raise ValueError(f"{name} cannot draft with a subset of its layers: its forward does not run each layer of "
                         f"{view.path} once, in order (it ran {order}), so a view of that list is not what it runs")
    seen = _layer_calls(view.model, full_list, ids, positions, mask, name)
    ran = [index for index, _, _ in seen]
    if ran != list(view.kept):
        raise ValueError(f"{name} cannot draft with a subset of its layers: a view keeping layers {list(view.kept)} "
                         f"of {view.path} ran layers {ran}; its forward does not follow the layer list")
    for index, args, kwargs in seen:
        _, full_args, full_kwargs = full[index]
        different = _different_inputs(full_args, full_kwargs, args, kwargs)
        if different is not None:
            raise ValueError(f"{name} cannot draft with a subset of its layers: in a view keeping layers "
                             f"{list(view.kept)}, layer {index} receives another {different} than in the full "
                             "forward (its forward picks per-layer inputs by loop position)")


def _probe_inputs(model: PreTrainedModel) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """ids [1, 3], positions [1, 3] and the explicit masks of a causal probe forward, a sliding
    layer's window shrunk to 1 so that its mask differs from a full layer's."""
    anchor = next(model.parameters())
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = (torch.arange(3, device=anchor.device) % vocab)[None]  # (1, 3)
    positions = torch.arange(3, device=anchor.device)[None]  # (1, 3)
    kinds = attention_kinds(model)
    probe = Attention(full=kinds.full, window=1 if kinds.sliding else None)
    visible = torch.ones(3, 3, dtype=torch.bool, device=anchor.device).tril()[None]  # (1, 3, 3)
    dtype = anchor.dtype if anchor.is_floating_point() else torch.float32
    return ids, positions, layer_masks(probe, visible, positions, positions, dtype)


def _layer_calls(module: nn.Module, layers: list[nn.Module], ids: torch.Tensor, positions: torch.Tensor,
                 mask: Any, name: str) -> list[tuple[int, tuple[Any, ...], dict[str, Any]]]:
    """(layer index, args, kwargs) of each call of one of `layers` during a forward of `module`,
    in order, seen through a process-wide forward hook (nothing is registered on the modules)."""
    index = {id(layer): i for i, layer in enumerate(layers)}
    calls: list[tuple[int, tuple[Any, ...], dict[str, Any]]] = []

    def record(called: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if id(called) in index:
            calls.append((index[id(called)], args, dict(kwargs)))

    handle = torch.nn.modules.module.register_module_forward_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            module(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    except Exception as error:
        raise ValueError(f"{name} cannot draft with a subset of its layers: a probe forward with explicit masks "
                         f"and positions failed: {type(error).__name__}: {error}") from error
    finally:
        handle.remove()
    return calls


def _different_inputs(full_args: tuple[Any, ...], full_kwargs: dict[str, Any], args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> str | None:
    """The name of the first input, but the hidden states (the first argument), that differs; None if all agree."""
    hidden_first = bool(full_args)
    if len(full_args) != len(args) or set(full_kwargs) != set(kwargs):
        return "set of arguments"
    for i, (a, b) in enumerate(zip(full_args, args)):
        if i > 0 and not _same(a, b):
            return f"argument {i}"
    for key in full_kwargs:
        if (hidden_first or key != "hidden_states") and not _same(full_kwargs[key], kwargs[key]):
            return repr(key)
    return None


def _same(a: Any, b: Any) -> bool:
    """Whether two layer inputs are alike: tensors equal, containers alike item by item, else equal."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and \
            a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    try:
        return bool(a == b)
    except Exception:  # an object whose comparison raises is taken as different
        return False


def crop_layers(cache: Cache, length: int) -> None:
    """Cut each layer of a dynamic cache holding more than `length` positions back to `length`.

    A view grows only the layers it runs, so the cache's layers differ in length after a draft;
    transformers' crop takes a count to remove, which differs per layer."""
    for layer in cache.layers:
        held = int(layer.get_seq_length()) if getattr(layer, "is_initialized", False) else 0
        if held > length:
            layer.crop(length - held)
