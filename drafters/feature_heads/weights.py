"""Reading a drafter checkpoint's tensors: `model.safetensors`, else `pytorch_model.bin` (loaded
with `weights_only=True`, so a pickle cannot run code)."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["HEAD_FILES", "PICKLE", "SAFETENSORS", "read_weights"]

SAFETENSORS = "model.safetensors"
PICKLE = "pytorch_model.bin"
HEAD_FILES = ("config.json", SAFETENSORS, PICKLE)  # what a hub repository of a head gives (`resolve_checkpoint`)


def read_weights(directory: Path, drafter: str) -> tuple[Path, dict[str, torch.Tensor]]:
    """(the file read, its tensors by name); raises naming `drafter` and the directory."""
    for name in (SAFETENSORS, PICKLE):
        file = directory / name
        if file.is_file():
            if name == SAFETENSORS:
                from safetensors.torch import load_file

                return file, load_file(str(file))
            return file, torch.load(file, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{drafter}: {str(directory)!r} holds neither {SAFETENSORS} nor {PICKLE}")
