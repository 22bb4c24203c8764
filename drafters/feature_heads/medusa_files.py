"""Medusa checkpoint directories in the public Medusa-1 layout: `config.json` (`medusa_num_heads`,
`medusa_num_layers`, optionally `hidden_size`, `vocab_size`) and `medusa_lm_head.safetensors` or
`medusa_lm_head.pt`, keys `{h}.{l}.linear.weight`, `{h}.{l}.linear.bias` for l < L and
`{h}.{L}.weight` for the vocabulary projection (`specdec.drafters.feature_heads.medusa_head`).
Every fault names the file, the key and what to do."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdec.checkpoints import resolve_checkpoint
from specdec.drafters.feature_heads.medusa_head import MedusaHeads

__all__ = ["CONFIG", "HUB_FILES", "SAFETENSORS", "TORCH", "check_shapes", "expected_shapes", "load_medusa",
           "read_medusa", "save_medusa"]

CONFIG = "config.json"
SAFETENSORS = "medusa_lm_head.safetensors"
TORCH = "medusa_lm_head.pt"
HUB_FILES = (CONFIG, SAFETENSORS, TORCH)  # what a hub repository of heads gives (`resolve_checkpoint`)


def expected_shapes(num_heads: int, num_layers: int, hidden_size: int,
                    vocab_size: int) -> dict[str, tuple[int, ...]]:
    """Every key of the Medusa layout and its shape, in state-dict order."""
    shapes: dict[str, tuple[int, ...]] = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            shapes[f"{h}.{layer}.linear.weight"] = (hidden_size, hidden_size)
            shapes[f"{h}.{layer}.linear.bias"] = (hidden_size,)
        shapes[f"{h}.{num_layers}.weight"] = (vocab_size, hidden_size)
    return shapes


def check_shapes(tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], file: Path,
                  hint: str) -> None:
    """Raise naming the file, the first bad key and both shapes; `hint` says what to do."""
    for key, shape in expected.items():
        if key not in tensors:
            present = ", ".join(sorted(tensors)[:8]) + (", ..." if len(tensors) > 8 else "")
            raise KeyError(f"medusa: {file}: key {key!r} is missing (expected shape {shape}); the file "
                           f"holds [{present}]; {hint}")
        actual = tuple(tensors[key].shape)
        if actual != shape:
            raise ValueError(f"medusa: {file}: key {key!r} has shape {actual}, expected {shape}; {hint}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise ValueError(f"medusa: {file}: unexpected keys {unexpected[:8]} for a checkpoint of "
                         f"{len(expected)} tensors; {hint}")


def _read_config(directory: Path) -> dict[str, int]:
    path = directory / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"medusa: {path} not found; a Medusa checkpoint directory needs {CONFIG} "
                                "with medusa_num_heads and medusa_num_layers")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"medusa: {path} is not valid JSON: {error}") from None
    config: dict[str, int] = {}
    for field in ("medusa_num_heads", "medusa_num_layers", "hidden_size", "vocab_size"):
        value = raw.get(field) if isinstance(raw, dict) else None
        if value is None and field.startswith("medusa_"):
            raise ValueError(f"medusa: {path} has no {field!r}; add it (the number of Medusa "
                             f"{'heads' if field.endswith('heads') else 'residual blocks per head'})")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < (0 if field == "medusa_num_layers" else 1)):
            least = 0 if field == "medusa_num_layers" else 1
            raise ValueError(f"medusa: {path}: {field} must be an int >= {least}, got {value!r}")
        if value is not None:
            config[field] = value
    return config


def _read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The tensors of the weights file (safetensors preferred) and its path."""
    if (directory / SAFETENSORS).is_file():
        from safetensors.torch import load_file

        file = directory / SAFETENSORS
        return load_file(str(file)), file
    if (directory / TORCH).is_file():
        file = directory / TORCH
        state = torch.load(file, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ValueError(f"medusa: {file} does not hold a state dict of tensors")
        return dict(state), file
    raise FileNotFoundError(f"medusa: {directory} holds neither {SAFETENSORS} nor {TORCH}")


def read_medusa(path: str | Path) -> tuple[MedusaHeads, Path]:
    """The heads of a Medusa checkpoint (a directory or a hub id; CPU, the file's dtype) and its weights file."""
    directory = resolve_checkpoint(path, "medusa heads", HUB_FILES)
    config = _read_config(directory)
    tensors, file = _read_weights(directory)
    heads, layers = config["medusa_num_heads"], config["medusa_num_layers"]
    projection = tensors.get(f"0.{layers}.weight")  # (V, H): sizes the config may omit
    if projection is None and not {"hidden_size", "vocab_size"} <= set(config):
        raise KeyError(f"medusa: {file}: key '0.{layers}.weight' (the first head's vocabulary "
                       f"projection) is missing, and {CONFIG} gives no hidden_size / vocab_size")
    inferred = tuple(projection.shape) + (0, 0) if projection is not None else (0, 0)
    vocab_size = config.get("vocab_size", inferred[0])
    hidden_size = config.get("hidden_size", inferred[1])
    hint = (f"the checkpoint declares {heads} heads of {layers} blocks, hidden size {hidden_size}, "
            f"vocabulary {vocab_size} ({CONFIG}, else key '0.{layers}.weight')")
    check_shapes(tensors, expected_shapes(heads, layers, hidden_size, vocab_size), file, hint)
    integral = sorted(key for key, tensor in tensors.items() if not tensor.is_floating_point())
    if integral:
        raise ValueError(f"medusa: {file}: keys {integral[:8]} are not floating point")
    model = MedusaHeads(heads, layers, hidden_size, vocab_size).to(tensors[f"0.{layers}.weight"].dtype)
    model.load_state_dict(tensors)
    return model.eval(), file


def load_medusa(path: str | Path) -> MedusaHeads:
    """Read a Medusa checkpoint directory (CPU, the file's dtype)."""
    return read_medusa(path)[0]


def save_medusa(heads: MedusaHeads, path: str | Path, safe: bool = True) -> None:
    """Write `heads` as a Medusa checkpoint directory (safetensors, or a torch state dict),
    replacing a checkpoint already there in either format."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers,
              "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size}
    (directory / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    state = {key: tensor.detach().cpu().contiguous() for key, tensor in heads.state_dict().items()}
    (directory / (TORCH if safe else SAFETENSORS)).unlink(missing_ok=True)  # loading prefers safetensors
    if safe:
        from safetensors.torch import save_file

        save_file(state, str(directory / SAFETENSORS))
    else:
        torch.save(state, directory / TORCH)
