"""Medusa-1 heads in vLLM's layout (`specdec.export.layouts`, ("medusa", "vllm")), and its reader.

specdec's checkpoint (`specdec.drafters.feature_heads.medusa`) stores head h as `{h}.{l}.linear.{weight,bias}` and
`{h}.{L}.weight`; vLLM's `Medusa` module names the same tensors `blocks.{h}.layers.{l}.{weight,bias}`
and `lm_heads.{h}.weight`, and reads `num_heads` / `num_hidden_layers` from a `model_type: medusa`
config. The block is the same x + SiLU(W x + b) in both, so the tensors are copied unchanged.
specdec's loader does not read vLLM's names: `read` converts an export back.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec.drafters.feature_heads.medusa_head import MedusaHeads

from specdec.drafters.feature_heads.medusa_files import HUB_FILES, load_medusa, save_medusa
from specdec.export.fit import check_target_sizes
from specdec.staging import write_json

__all__ = ["SOURCE_FILES", "read", "vllm_names", "write"]

SOURCE_FILES = HUB_FILES  # what SRC, a hub id, gives

WEIGHTS = "model.safetensors"


def vllm_names(heads: MedusaHeads) -> dict[str, str]:
    """specdec state-dict key -> vLLM's name for it."""
    names = {}
    for h in range(heads.num_heads):
        for layer in range(heads.num_layers):
            names[f"{h}.{layer}.linear.weight"] = f"blocks.{h}.layers.{layer}.weight"
            names[f"{h}.{layer}.linear.bias"] = f"blocks.{h}.layers.{layer}.bias"
        names[f"{h}.{heads.num_layers}.weight"] = f"lm_heads.{h}.weight"
    return names


def write(src: Path, engine: str, staging: Path, target: Path | None) -> None:
    """Write the Medusa checkpoint at `src` into `staging` in vLLM's layout."""
    from safetensors.torch import save_file

    heads = load_medusa(src)
    if target is not None:
        check_target_sizes("medusa", src, heads.hidden_size, heads.vocab_size, target)
    state = heads.state_dict()
    tensors = {name: state[key].detach().contiguous() for key, name in vllm_names(heads).items()}
    save_file(tensors, str(staging / WEIGHTS), metadata={"format": "pt"})
    write_json(staging / "config.json", {
        "model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": heads.hidden_size,
        "vocab_size": heads.vocab_size, "num_heads": heads.num_heads, "num_hidden_layers": heads.num_layers,
        "truncated_vocab_size": heads.vocab_size, "original_lm_head": False, "medusa_fc_bias": True,
        "torch_dtype": str(next(heads.parameters()).dtype).removeprefix("torch.")})


def read(exported: Path, engine: str, scratch: Path) -> Path:
    """A specdec Medusa checkpoint in `scratch` holding the heads of the vLLM export at `exported`."""
    from safetensors.torch import load_file

    config_file, file = exported / "config.json", exported / WEIGHTS
    if not config_file.is_file() or not file.is_file():
        raise FileNotFoundError(f"medusa: {exported} holds no vLLM Medusa export (config.json and {WEIGHTS})")
    config = json.loads(config_file.read_text())
    try:
        heads = MedusaHeads(config["num_heads"], config["num_hidden_layers"], config["hidden_size"],
                            config["vocab_size"])
    except KeyError as error:
        raise KeyError(f"medusa: {config_file} lacks {error.args[0]!r}; is it a vLLM Medusa config?") from None
    stored = load_file(str(file))
    names = vllm_names(heads)
    unexpected = sorted(set(stored) - set(names.values()))
    if unexpected:
        raise ValueError(f"medusa: {file} holds keys vLLM's Medusa does not have: {unexpected[:5]}")
    state = {}
    for key, name in names.items():
        if name not in stored:
            raise KeyError(f"medusa: {file} lacks {name!r} (expected shape {tuple(heads.state_dict()[key].shape)})")
        state[key] = stored[name]
    heads.to(dtype=stored["lm_heads.0.weight"].dtype)
    heads.load_state_dict(state)
    save_medusa(heads, scratch)
    return scratch
