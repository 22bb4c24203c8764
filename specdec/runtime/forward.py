"""One forward of a transformers causal LM on a cache, as every adapter runs it: the logits of the
rows asked for, the hidden states of the layers named, an optional 4D mask and position ids; what
a model needs before its forward is compiled; and the parts of a model the adapter reads (its LM
head's weight, its final norm, its placement across devices).

`hidden_states` indices are transformers': 0 is the embeddings, i the residual stream entering
layer i, num_layers (or LAST_LAYER) the post-norm last layer.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

__all__ = ["LAST_LAYER", "compilable_experts", "final_norm", "float_parameter", "head_shape", "is_pipelined",
           "model_forward",
           "prepare_for_compile"]

LAST_LAYER = -1  # the `hidden_states` index of the post-norm last layer, whatever the model counts
_FINAL_NORM_PATHS = ("model.norm", "transformer.ln_f", "model.final_layernorm", "gpt_neox.final_layer_norm",
                     "model.decoder.final_layer_norm")


def is_pipelined(model: PreTrainedModel) -> bool:
    """Whether `model` runs across pipeline stages: a transformers pipeline-parallel stage, or a
    `device_map` placing its modules on more than one device."""
    if getattr(model, "_pp_stage", None) is not None:
        return True
    placement = getattr(model, "hf_device_map", None) or {}
    return len({str(device) for device in placement.values() if str(device) not in ("disk", "meta")}) > 1




def model_forward(model: PreTrainedModel, cache: Cache, input_ids: torch.Tensor, keep: int | torch.Tensor,
                  hidden: tuple[int, ...], mask: torch.Tensor | dict[str, torch.Tensor] | None,
                  positions: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward of `model` on `cache`: (logits [keep, V], the hidden states of the layers
    `hidden` names, concatenated [n, len(hidden) * H], or None when it names none).

    input_ids [n] is one sequence; [B, n] is a batch (`specdec.runtime.batch_target`), whose outputs
    keep the batch dimension: [B, keep, V] and [B, n, len(hidden) * H]."""
    batched = input_ids.dim() == 2
    out = model(
        input_ids=input_ids if batched else input_ids.unsqueeze(0),  # (B, n)
        cache=cache,
        use_cache=True,
        logits_to_keep=keep,
        output_hidden_states=bool(hidden),
        attention_mask=mask,  # (B, 1, n, width) additive, one per layer type where kinds mix, or None for causal
        position_ids=positions,  # (B, n) or None for C, C + 1, ...
    )
    logits = out.logits if batched else out.logits[0]  # ([B,] keep, V)
    states = torch.cat([out.hidden_states[i] if batched else out.hidden_states[i][0] for i in hidden], dim=-1) \
        if hidden else None  # ([B,] n, len * H)
    return logits, states


def prepare_for_compile(model: PreTrainedModel) -> None:
    """Make `model`'s forward traceable whole: its experts off transformers' eager implementation
    (`compilable_experts`), and transformers' output-capturing hooks installed now (transformers
    installs them under a lock on first use, which dynamo cannot trace), once: after an eager forward
    they are already on the inner model, and hooks installed again record every layer twice."""
    compilable_experts(model)
    try:
        from transformers.utils.output_capturing import maybe_install_capturing_hooks
    except ImportError:  # a transformers without lazy hooks needs nothing
        return
    if any(getattr(module, "_output_capturing_hooks_installed", False) for module in model.modules()):
        return  # an eager forward installed them on the inner model: installing on the outer one would record twice
    maybe_install_capturing_hooks(model)


def compilable_experts(model: PreTrainedModel) -> str | None:
    """Move mixture-of-experts layers that run transformers' eager experts to an implementation
    that compiles; the one chosen, or None when no experts ran eagerly.

    The eager experts loop over the experts a batch routes to, a data-dependent loop dynamo
    cannot trace whole, so the compiled step would fall back to eager. The replacement computes
    the same (the same tokens, up to the rounding of a sum's order): "grouped_mm" (torch's
    grouped kernel, transformers' default) in bfloat16; "batched_mm" (one batched matmul over
    each routed token's experts) in every other dtype, since float64 has no grouped kernel and
    transformers compiles grouped_mm in float32 or float16 to a loop that syncs with the host.
    batched_mm gathers every routed token's expert weights: cheap for the few rows of a decode
    step, heavy for a long prompt on a large MoE, so run such a model in bfloat16 or choose its
    implementation before compiling. The switch stays on the model, eager forwards included;
    `model.set_experts_implementation("eager")` undoes it.
    """
    eager = [part for part in model.modules() if isinstance(part, PreTrainedModel) and _runs_eager_experts(part)]
    if not eager:
        return None
    choice = "grouped_mm" if model.dtype == torch.bfloat16 else "batched_mm"
    for part in eager:
        part.set_experts_implementation(choice)
    return choice


def _runs_eager_experts(model: PreTrainedModel) -> bool:
    """Whether `model`'s own experts layers (not a sub-model's) run transformers' eager experts."""
    can_set = getattr(type(model), "_can_set_experts_implementation", None)  # (transformers 5 on)
    if can_set is None or not hasattr(model, "get_experts_implementation") or not can_set():
        return False  # no experts layers whose implementation transformers dispatches
    return model.get_experts_implementation().get("") == "eager"


def head_shape(model: PreTrainedModel) -> tuple[int, int] | None:
    """The LM head's (V, H): its weight's shape, or a quantized head's (`specdec.runtime.quantize`)
    features; None on a pipeline stage that holds no LM head."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0]), int(weight.shape[1])
    if isinstance(getattr(head, "out_features", None), int) and isinstance(getattr(head, "in_features", None), int):
        return int(head.out_features), int(head.in_features)  # type: ignore[union-attr]
    return None


def float_parameter(model: nn.Module) -> torch.Tensor:
    """A floating-point parameter of `model` (the input embedding's when it has one): the device and
    dtype its forward computes in, which a quantized model's int8 weights do not tell."""
    embed = getattr(model, "get_input_embeddings", lambda: None)()
    weight = getattr(embed, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.is_floating_point():
        return weight
    return next((p for p in model.parameters() if p.is_floating_point()), next(model.parameters()))


def final_norm(model: PreTrainedModel) -> nn.Module | None:
    """The norm applied before the LM head, when the architecture has a known one."""
    for path in _FINAL_NORM_PATHS:
        module: object = model
        for part in path.split("."):
            module = getattr(module, part, None)
        if isinstance(module, nn.Module):
            return module
    return None
