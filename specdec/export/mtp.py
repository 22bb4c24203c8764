"""An MTP module as Qwen3-Next-layout `mtp.*` tensors in a copy of the target's checkpoint, which is
where vLLM (`Qwen3NextMTP`) and SGLang (`Qwen3NextForCausalLMMTP`) read it (`specdec.export.layouts`).

The copy keeps every file of `--target` (default: SRC itself; of a hub id, the files that
`specdec.checkpoints.MODEL_FILES` names) byte for byte, except that weight files holding `mtp.*`
keys are rewritten without them; the module goes into one more shard,
`model-mtp.safetensors`, named by a `model.safetensors.index.json` that maps every key. MoE experts,
fused in transformers' modules, are stored per expert (`experts.{e}.{gate,up,down}_proj.weight`) as
public checkpoints and the engines' loaders have them. The config gains `mtp_num_hidden_layers`,
`num_nextn_predict_layers` (vLLM's count of MTP layers) and `mtp_use_dedicated_embeddings`.
specdec's own loader (`specdec.drafters.feature_heads.mtp.load_mtp`) reads the export as it is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from specdec.checkpoints import MODEL_FILES
from specdec.drafters.feature_heads.mtp_files import INDEX, MTP_FILES, SAFETENSORS, load_mtp, mtp_checkpoint_keys
from specdec.drafters.feature_heads.mtp_head import MtpHead
from specdec.export.fit import target_config
from specdec.export.layouts import layout_for
from specdec.staging import write_json

__all__ = ["MTP_FILE", "SOURCE_FILES", "read", "split_experts", "write"]

MTP_FILE = "model-mtp.safetensors"
SOURCE_FILES = (*MODEL_FILES, *MTP_FILES)  # what SRC, a hub id, gives: a target to copy, its module


def split_experts(head: MtpHead) -> dict[str, torch.Tensor]:
    """The module's tensors under checkpoint names, fused experts split into one tensor per expert."""
    state = head.state_dict()
    out: dict[str, torch.Tensor] = {}
    for key, stored in mtp_checkpoint_keys(head).items():
        value = state[key].detach()
        base = stored.rsplit(".", 1)[0]  # ...mlp.experts
        if stored.endswith("experts.gate_up_proj"):  # (E, 2I, H): gate rows then up rows
            for e, rows in enumerate(value):
                gate, up = rows.chunk(2)
                out[f"{base}.{e}.gate_proj.weight"], out[f"{base}.{e}.up_proj.weight"] = gate, up
        elif stored.endswith("experts.down_proj"):  # (E, H, I)
            out.update({f"{base}.{e}.down_proj.weight": rows for e, rows in enumerate(value)})
        else:
            out[stored] = value
    return {key: value.contiguous() for key, value in out.items()}


def _check(head: MtpHead, src: Path, target: Path, engine: str) -> None:
    if head.layout != "qwen":
        raise ValueError(f"export: the MTP module at {str(src)!r} is in the DeepSeek-V3 layout "
                         "(model.layers.{L}.*), which vLLM (method mtp) and SGLang (DeepseekV3ForCausalLMNextN) "
                         "read from that checkpoint as it is; serve it directly (specdec exports the Qwen3-Next "
                         "mtp.* layout)")
    layers = len(head.stages[0].layers)  # type: ignore[arg-type]
    if layers != 1:
        raise ValueError(f"export: the MTP module at {str(src)!r} stacks {layers} decoder layers in one stage; "
                         "vLLM reads mtp.layers.{i} as one layer per draft step, so only 1-layer modules export")
    config = target_config(target)
    architecture = (config.architectures or ["?"])[0]
    served = layout_for("mtp", engine).target_architectures
    if architecture not in served:
        raise ValueError(f"export: --target {str(target)!r} is a {architecture}; {engine} reads Qwen3-Next-layout "
                         f"mtp.* modules only from {list(served)} checkpoints")
    with torch.device("meta"):  # shapes only, nothing allocated
        expected = MtpHead(config, "qwen", 1).state_dict()
    names = mtp_checkpoint_keys(head)
    for key, tensor in head.state_dict().items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise ValueError(f"export: {names[key]!r} of the MTP module at {str(src)!r} has shape "
                             f"{tuple(tensor.shape)} but --target {str(target)!r} needs {tuple(expected[key].shape)}")


def _weight_files(target: Path) -> list[str]:
    if (target / INDEX).is_file():
        return sorted(set(json.loads((target / INDEX).read_text())["weight_map"].values()))
    if (target / SAFETENSORS).is_file():
        return [SAFETENSORS]
    raise FileNotFoundError(f"export: --target {str(target)!r} holds neither {SAFETENSORS} nor {INDEX}")


def _copy_target(target: Path, staging: Path) -> dict[str, str]:
    """Copy the target without its config and any `mtp.*` tensors; returns key -> weight file."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    weights = _weight_files(target)
    for entry in sorted(target.iterdir()):
        if entry.name in ("config.json", INDEX, *weights):
            continue
        if entry.is_dir():
            shutil.copytree(entry, staging / entry.name)
        else:
            shutil.copy2(entry, staging / entry.name)
    weight_map: dict[str, str] = {}
    for name in weights:
        with safe_open(str(target / name), framework="pt") as handle:
            keys = list(handle.keys())
            kept = [key for key in keys if not key.startswith("mtp.")]
            if len(kept) == len(keys):
                shutil.copy2(target / name, staging / name)
            elif kept:
                save_file({key: handle.get_tensor(key) for key in kept}, str(staging / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in kept})
    if MTP_FILE in weight_map.values():
        raise ValueError(f"export: --target {str(target)!r} has model weights in {MTP_FILE}, the file the MTP "
                         "module is written to; rename that shard first")
    return weight_map


def write(src: Path, engine: str, staging: Path, target: Path | None) -> None:
    """Write the MTP module at `src` into a copy of `target` (default `src`) in `staging`."""
    from safetensors.torch import save_file

    target = src if target is None else target
    head = load_mtp(src)
    _check(head, src, target, engine)
    weight_map = _copy_target(target, staging)
    tensors = split_experts(head)
    save_file(tensors, str(staging / MTP_FILE), metadata={"format": "pt"})
    weight_map.update({key: MTP_FILE for key in tensors})
    write_json(staging / INDEX, {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))})
    config = json.loads((target / "config.json").read_text())
    config.update(mtp_num_hidden_layers=1, num_nextn_predict_layers=1, mtp_use_dedicated_embeddings=False)
    write_json(staging / "config.json", config)


def read(exported: Path, engine: str, scratch: Path) -> Path:
    """The directory specdec's MTP loader reads for an export: the export itself."""
    return exported
