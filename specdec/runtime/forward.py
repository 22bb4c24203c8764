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

__all__ = ["LAST_LAYER", "final_norm", "head_weight", "is_pipelined", "model_forward", "prepare_for_compile"]

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
    """Install transformers' output-capturing hooks eagerly: transformers installs them under a
    lock on first use, which dynamo cannot trace."""
    try:
        from transformers.utils.output_capturing import maybe_install_capturing_hooks
    except ImportError:  # a transformers without lazy hooks needs nothing
        return
    maybe_install_capturing_hooks(model)


def head_weight(model: PreTrainedModel) -> torch.Tensor | None:
    """The LM head's weight (V, H); None on a pipeline stage that holds no LM head."""
    weight = getattr(model.get_output_embeddings(), "weight", None)
    return weight if isinstance(weight, torch.Tensor) else None


def final_norm(model: PreTrainedModel) -> nn.Module | None:
    """The norm applied before the LM head, when the architecture has a known one."""
    for path in _FINAL_NORM_PATHS:
        module: object = model
        for part in path.split("."):
            module = getattr(module, part, None)
        if isinstance(module, nn.Module):
            return module
    return None
