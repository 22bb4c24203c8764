"""EAGLE-1 heads in the layouts vLLM (`EagleLlamaForCausalLM`) and SGLang (`LlamaForCausalLMEagle`)
load (`specdec.export.layouts`).

Both read the public EAGLE-1 names specdec already uses (`fc.*`, `layers.0.*` without layer 0's
input norm, the target's embedding and LM head) from a one-layer Llama config; they differ in the
fc bias and in how the config names the architecture:
- vLLM builds fc without a bias and reads `bias` as the attention's bias, so the config says
  `bias: false` and a head whose fc bias is not zero is refused (dropping it would change drafts);
- SGLang always builds fc with a bias and also reads `bias` as the attention's bias, so the config
  has no `bias` and a head without one gets a zero bias (the same drafts).
specdec's own loader (`specdec.drafters.feature_heads.eagle.load_eagle`) reads both exports as they are.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.drafters.feature_heads.eagle import EagleHead, load_eagle
from specdec.drafters.feature_heads.weights import HEAD_FILES
from specdec.export.fit import check_target_sizes
from specdec.staging import write_json

__all__ = ["SOURCE_FILES", "read", "write"]

SOURCE_FILES = HEAD_FILES  # what SRC, a hub id, gives

WEIGHTS = "model.safetensors"
ARCHITECTURE = {"vllm": "LlamaForCausalLM", "sglang": "LlamaForCausalLMEagle"}


def _check_llama(head: EagleHead, src: Path) -> None:
    config = head.config
    names = list(getattr(config, "architectures", None) or ["LlamaForCausalLM"])
    if config.model_type != "llama" or names != ["LlamaForCausalLM"]:
        raise ValueError(f"export: the EAGLE head at {str(src)!r} is a {config.model_type} layer ({names}); vLLM "
                         "(EagleLlamaForCausalLM) and SGLang (LlamaForCausalLMEagle) serve EAGLE-1 heads of one "
                         "Llama decoder layer only")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(config, flag, False):
            raise ValueError(f"export: the EAGLE head at {str(src)!r} sets {flag}=true; the engines' EAGLE-1 "
                             "Llama layers have no such biases")


def _fc_bias(head: EagleHead, engine: str, src: Path) -> torch.Tensor | None:
    """The fc bias the engine's layout stores (None: none stored)."""
    bias = head.fc.bias
    if engine == "sglang":
        return torch.zeros_like(head.fc.weight[:, 0]) if bias is None else bias.detach()
    if bias is not None and torch.count_nonzero(bias) > 0:
        raise ValueError(f"export: the EAGLE head at {str(src)!r} has a non-zero fc.bias (max |b| = "
                         f"{bias.abs().max().item():.3g}), but vLLM's EagleLlamaForCausalLM builds fc without a "
                         "bias (vllm/model_executor/models/llama_eagle.py) and its drafts would change; "
                         "export it --to sglang, or use a head without an fc bias (config.json \"bias\": false)")
    return None


def write(src: Path, engine: str, staging: Path, target: Path | None) -> None:
    """Write the EAGLE-1 checkpoint at `src` into `staging` in `engine`'s layout."""
    from safetensors.torch import save_file

    head = load_eagle(src)
    _check_llama(head, src)
    if target is not None:
        check_target_sizes("eagle", src, head.config.hidden_size, head.config.vocab_size, target)
    tensors = {key: value.detach().contiguous() for key, value in head.state_dict().items() if key != "fc.bias"}
    bias = _fc_bias(head, engine, src)
    if bias is not None:
        tensors["fc.bias"] = bias.contiguous()
    save_file(tensors, str(staging / WEIGHTS), metadata={"format": "pt"})
    config = {key: value for key, value in head.config.to_dict().items() if not key.startswith("_")}
    config.update(architectures=[ARCHITECTURE[engine]], model_type="llama", num_hidden_layers=1,
                  tie_word_embeddings=False)
    config.pop("bias", None)
    if engine == "vllm":
        config["bias"] = False  # specdec's loader then builds fc without a bias too
    write_json(staging / "config.json", config)


def read(exported: Path, engine: str, scratch: Path) -> Path:
    """The directory specdec's EAGLE loader reads for an export: the export itself."""
    return exported
