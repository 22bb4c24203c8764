"""Reading and writing DFlash checkpoint directories in their published layout, the one vLLM
(`method: dflash`) and SGLang (`DFLASH`) load.

`config.json` is a Qwen3 configuration (`model_type: qwen3`, `architectures: ["DFlashDraftModel"]`)
with `block_size` (top level, or in `dflash_config`), `dflash_config: {mask_token_id,
target_layer_ids}` and `num_target_layers`. `model.safetensors` holds `fc.weight` [H, K * H],
`hidden_norm.weight`, `norm.weight` and `layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
self_attn.{q,k}_norm, post_attention_layernorm, mlp.{gate,up,down}_proj}.*`, unprefixed (a
`model.` prefix is accepted); no embedding, no LM head: the drafter reads the target's.
When `target_layer_ids` is absent, the layers are spread evenly from 1 to L - 3 over the
target's L layers (one draft layer: L // 2), as the reference does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from specdec.drafters.parallel.dflash_head import DFlashHead, DFlashSpec
from transformers import Qwen3Config

from specdec.staging import staged, write_json

__all__ = ["ARCHITECTURE", "default_layer_ids", "dflash_config", "load_dflash", "read_dflash_spec", "save_dflash"]

ARCHITECTURE = "DFlashDraftModel"
_FILES = ("config.json", "model.safetensors")
_IGNORED = ("rotary_emb.inv_freq",)


def default_layer_ids(target_layers: int, draft_layers: int) -> tuple[int, ...]:
    """The reference's layers when a config names none: `draft_layers` ids spread evenly from 1
    to target_layers - 3 (rounded), or the middle layer for one draft layer."""
    if draft_layers == 1:
        return (target_layers // 2,)
    start, end = 1, target_layers - 3
    return tuple(round(start + i * (end - start) / (draft_layers - 1)) for i in range(draft_layers))


def _int(raw: dict[str, Any], key: str, where: Path, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"dflash: {where}: {key!r} must be a non-negative integer, got {value!r}")
    return value


def read_dflash_spec(config_file: Path, target_layers: int | None = None) -> DFlashSpec:
    """The spec of a DFlash `config.json`; raises naming the file and the missing or bad field."""
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"dflash: {config_file} is not JSON ({error})") from None
    architectures = raw.get("architectures") or []
    if ARCHITECTURE not in architectures:
        raise ValueError(f"dflash: {config_file} names architectures {architectures}, not [{ARCHITECTURE!r}]; is it a "
                         "DFlash drafter?")
    extra = raw.get("dflash_config") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"dflash: {config_file}: 'dflash_config' must be an object, got {extra!r}")
    block = extra.get("block_size", raw.get("block_size"))
    if block is None:
        raise ValueError(f"dflash: {config_file} has no 'block_size' (top level or in 'dflash_config')")
    block = _int(raw, "block_size", config_file, block)
    if block < 2:
        raise ValueError(f"dflash: {config_file}: 'block_size' must be at least 2 (the last id and one mask), "
                         f"got {block}")
    if "mask_token_id" not in extra:
        raise ValueError(f"dflash: {config_file} has no 'dflash_config.mask_token_id'")
    mask = _int(raw, "dflash_config.mask_token_id", config_file, extra["mask_token_id"])
    layer_fields = {key: value for key, value in raw.items()
                    if key not in ("architectures", "auto_map", "dflash_config", "block_size", "num_target_layers",
                                   "transformers_version", "dtype", "torch_dtype")}
    layer = Qwen3Config(**layer_fields)
    declared = raw.get("num_target_layers", extra.get("num_target_layers"))
    declared = None if declared is None else _int(raw, "num_target_layers", config_file, declared)
    ids = extra.get("target_layer_ids")
    if ids is None:
        count = declared if declared is not None else target_layers
        if count is None:
            raise ValueError(f"dflash: {config_file} names neither 'dflash_config.target_layer_ids' nor "
                             "'num_target_layers'")
        ids = default_layer_ids(count, layer.num_hidden_layers)
    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError(f"dflash: {config_file}: 'dflash_config.target_layer_ids' must be a non-empty list of layer "
                         f"indices, got {ids!r}")
    if mask >= layer.vocab_size:
        raise ValueError(f"dflash: {config_file}: 'mask_token_id' {mask} is outside the vocabulary "
                         f"(vocab_size {layer.vocab_size})")
    return DFlashSpec(layer, block, mask, tuple(ids), declared)


def load_dflash(path: str | Path) -> DFlashHead:
    """Read a DFlash checkpoint directory (or hub id), weights in their stored dtype."""
    from safetensors.torch import load_file

    from specdec.checkpoints import resolve_checkpoint

    directory = resolve_checkpoint(path, "DFlash drafter", _FILES)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"dflash: {str(directory)!r} is not a DFlash checkpoint (no config.json)")
    spec = read_dflash_spec(config_file)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"dflash: {str(directory)!r} holds no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update({key.removeprefix("model."): value for key, value in load_file(str(file)).items()
                        if not key.endswith(_IGNORED)})
    head = DFlashHead(spec)
    expected = {key: value for key, value in head.state_dict().items() if not key.startswith("rotary_emb.")}
    named = files[0] if len(files) == 1 else directory
    own = sorted(key for key in weights if key.startswith(("embed_tokens.", "lm_head.")))
    weights = {key: value for key, value in weights.items() if key not in own}  # the target's are used
    unexpected = sorted(key for key in weights if key not in expected)
    if unexpected:
        raise ValueError(f"dflash: {named} holds keys a DFlash drafter does not have: {unexpected[:5]}")
    for key, tensor in expected.items():
        if key not in weights:
            raise KeyError(f"dflash: {named} lacks {key!r} (expected shape {tuple(tensor.shape)} from {config_file})")
        if weights[key].shape != tensor.shape:
            raise ValueError(f"dflash: {named}: {key!r} has shape {tuple(weights[key].shape)}, expected "
                             f"{tuple(tensor.shape)} from {config_file}")
    dtype = weights["fc.weight"].dtype
    head.to(dtype=dtype)
    head.load_state_dict({key: weights[key].to(dtype) for key in expected}, strict=False)
    head.rotary_emb.inv_freq = head.rotary_emb.original_inv_freq.float()
    head.files = (config_file, named)
    return head.eval()


def dflash_config(spec: DFlashSpec) -> dict[str, Any]:
    """The published `config.json` of `spec`: the Qwen3 fields, `block_size`, `rope_theta` and
    `num_target_layers` at the top level (where every loader looks) and `dflash_config`."""
    config = spec.layer.to_dict()
    for key in ("transformers_version", "auto_map", "dtype", "torch_dtype"):
        config.pop(key, None)
    rope = getattr(spec.layer, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(spec.layer, "rope_theta", None))
    config.update(architectures=[ARCHITECTURE], model_type="qwen3", block_size=spec.block_size,
                  dflash_config={"mask_token_id": spec.mask_token_id, "target_layer_ids": list(spec.target_layer_ids),
                                 "block_size": spec.block_size},
                  tie_word_embeddings=False)
    if theta is not None:
        config["rope_theta"] = theta
    if spec.num_target_layers is not None:
        config["num_target_layers"] = spec.num_target_layers
    return config


def save_dflash(head: DFlashHead, directory: str | Path) -> Path:
    """Write `head` as a DFlash checkpoint directory (config.json, model.safetensors), staged and
    renamed into place, so a failed write leaves nothing behind."""
    from safetensors.torch import save_file

    target = Path(directory)
    with staged(target) as staging:
        write_json(staging / "config.json", dflash_config(head.spec))
        tensors = {key: value.detach().contiguous().cpu() for key, value in head.state_dict().items()
                   if not key.startswith("rotary_emb.")}
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
    return target
