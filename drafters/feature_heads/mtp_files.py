"""Reading a target checkpoint's multi-token-prediction module (`specdec.drafters.feature_heads.mtp`): which of
its safetensors keys hold the MTP weights, in which layout, and the head built from them.

Layouts (in the target's safetensors; transformers drops these keys when it loads the model):
  qwen (Qwen3-Next, Qwen3.5): `mtp.fc`, `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`,
    `mtp.layers.{i}.*` (`mtp_num_hidden_layers`, default 1), `mtp.norm`; Gemma-style norms
    x * (1 + w); one stage reused at every depth; the fed-back feature is the normed output.
  deepseek (DeepSeek-V3): `model.layers.{L+i}.{enorm,hnorm,eh_proj,shared_head.norm}` plus that
    layer's decoder weights, i < `num_nextn_predict_layers`; standard RMSNorm; stage i drafts
    depth i+1 (the last one beyond); the fed-back feature is the output before shared_head.norm.
    All stages share one KV cache layer.
Per-expert MoE weights are fused into transformers' expert tensors as they are read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, PretrainedConfig

from specdec.checkpoints import resolve_checkpoint
from specdec.drafters.feature_heads.mtp_head import MtpHead

__all__ = ["INDEX", "MTP_FILES", "SAFETENSORS", "load_mtp", "mtp_checkpoint_keys"]

SAFETENSORS = "model.safetensors"
INDEX = "model.safetensors.index.json"
# what the module is read from in a hub repository (`resolve_checkpoint`): the target's config and
# its safetensors weights, single or sharded
MTP_FILES = ("config.json", INDEX, "model*.safetensors")
_IGNORED = ("embed_tokens.weight", "shared_head.head.weight", "rotary_emb.inv_freq")  # copies, unused


def mtp_checkpoint_keys(head: MtpHead) -> dict[str, str]:
    """head.state_dict() key -> the key the target's checkpoint stores it under."""
    names = {"emb_norm": "enorm", "hidden_norm": "hnorm", "proj": "eh_proj", "out_norm": "shared_head.norm"}
    if head.layout == "qwen":
        names = {"emb_norm": "pre_fc_norm_embedding", "hidden_norm": "pre_fc_norm_hidden", "proj": "fc",
                 "out_norm": "norm"}
    keys = {}
    for key in head.state_dict():
        _, stage, part, rest = key.split(".", 3)  # stages.{s}.{part}.{rest}
        if head.layout == "qwen":
            keys[key] = f"mtp.{names.get(part, part)}.{rest}"
        elif part == "layers":  # layers.0.* sit directly under model.layers.{L+s}
            keys[key] = f"model.layers.{head.base_layers + int(stage)}.{rest.split('.', 1)[1]}"
        else:
            keys[key] = f"model.layers.{head.base_layers + int(stage)}.{names[part]}.{rest}"
    return keys


def _key_files(path: Path) -> dict[str, Path]:
    """Every stored key -> the safetensors file holding it (single file or sharded index)."""
    if (path / INDEX).is_file():
        weight_map = json.loads((path / INDEX).read_text())["weight_map"]
        return {key: path / name for key, name in weight_map.items()}
    if (path / SAFETENSORS).is_file():
        from safetensors import safe_open

        with safe_open(str(path / SAFETENSORS), framework="pt") as handle:
            return {key: path / SAFETENSORS for key in handle.keys()}
    raise FileNotFoundError(f"mtp: {str(path)!r} holds neither {SAFETENSORS} nor {INDEX}; pass the target "
                            "checkpoint directory (MTP weights are read from its safetensors)")


def _read(files: dict[str, Path], keys: list[str]) -> dict[str, torch.Tensor]:
    """Read only `keys`, opening each shard that holds some of them once."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for file in sorted({files[key] for key in keys}):
        with safe_open(str(file), framework="pt") as handle:
            out.update({key: handle.get_tensor(key) for key in keys if files[key] == file})
    return out


def _fuse_experts(weights: dict[str, torch.Tensor], expected: dict[str, str], files: dict[str, Path]) -> None:
    """Per-expert `experts.{e}.{gate,up,down}_proj.weight` -> transformers' fused expert tensors."""
    for stored in expected.values():
        if stored in weights or not stored.endswith(("experts.gate_up_proj", "experts.down_proj")):
            continue
        base = stored.rsplit(".", 1)[0]  # ...mlp.experts
        count = sum(1 for key in files if key.startswith(base + ".") and key.endswith(".down_proj.weight"))
        if count == 0:
            continue
        names = ["gate_proj", "up_proj"] if stored.endswith("gate_up_proj") else ["down_proj"]
        parts = _read(files, [f"{base}.{e}.{n}.weight" for e in range(count) for n in names
                              if f"{base}.{e}.{n}.weight" in files])
        if len(parts) == count * len(names):
            weights[stored] = torch.stack([torch.cat([parts[f"{base}.{e}.{n}.weight"] for n in names])
                                           for e in range(count)])  # (E, out, in)


def _layout(files: dict[str, Path], text: PretrainedConfig, where: Path) -> tuple[str, int, tuple[str, ...]]:
    """(layout, number of stages, key prefixes of the MTP weights) from the stored key names."""
    base = int(text.num_hidden_layers)
    if any(key.startswith("mtp.") for key in files):
        return "qwen", 1, ("mtp.",)
    if any(key.startswith(f"model.layers.{base}.") for key in files):
        stages = int(getattr(text, "num_nextn_predict_layers", 0) or 0) or sum(
            1 for i in range(base, base + 64) if f"model.layers.{i}.eh_proj.weight" in files)
        return "deepseek", stages, tuple(f"model.layers.{base + i}." for i in range(stages))
    raise ValueError(f"mtp: {where} holds no MTP weights (neither 'mtp.*' keys nor 'model.layers.{base}.*' "
                     f"after the {base} main layers); this checkpoint has no multi-token-prediction module")


def load_mtp(path: str | Path) -> MtpHead:
    """Build the MTP head of the target checkpoint at `path` (a directory or a hub id) and load its weights."""
    path = resolve_checkpoint(path, "mtp target checkpoint", MTP_FILES)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"mtp: {str(path)!r} is not a model checkpoint (no config.json); pass the "
                                "target's checkpoint directory")
    config = AutoConfig.from_pretrained(str(path))
    text = config.get_text_config()
    text.architectures = text.architectures or config.architectures
    files = _key_files(path)
    where = path / (INDEX if (path / INDEX).is_file() else SAFETENSORS)
    layout, stages, prefixes = _layout(files, text, where)
    head = MtpHead(text, layout, stages)
    head.file = where
    keys = mtp_checkpoint_keys(head)
    stored_keys = [key for key in files if key.startswith(prefixes)]
    wanted = set(keys.values())
    unexpected = sorted(key for key in stored_keys if key not in wanted and not key.endswith(_IGNORED)
                        and ".experts." not in key)
    if unexpected:
        raise ValueError(f"mtp: {where} holds MTP keys this {layout} layout does not have: {unexpected[:5]}")
    weights = _read(files, [key for key in wanted if key in files])
    _fuse_experts(weights, keys, files)
    expected = head.state_dict()
    for name, stored in keys.items():
        shape = tuple(expected[name].shape)
        if stored not in weights:
            raise KeyError(f"mtp: {where} lacks {stored!r} (expected shape {shape})")
        if tuple(weights[stored].shape) != shape:
            raise ValueError(f"mtp: {files.get(stored, where)}: {stored!r} has shape "
                             f"{tuple(weights[stored].shape)}, expected {shape} from {path / 'config.json'}")
    head.to(dtype=weights[keys["stages.0.proj.weight"]].dtype)
    head.load_state_dict({name: weights[stored] for name, stored in keys.items()})
    return head.eval()
