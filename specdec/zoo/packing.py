"""The file transforms of the shipped zoo (`specdec.zoo.shipped`): checksums, a digest of a
file's contents, and weights halved for storage and restored to float32 on unpacking."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

__all__ = ["content_digest", "corpus_fingerprint", "halvable", "pack_weights", "sha256", "unpack_weights"]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def content_digest(path: Path) -> str:
    """SHA-256 of a file's contents: a safetensors file's tensors (name, dtype, shape, bytes, in
    name order), so that another safetensors version's header layout does not count; any other
    file's bytes."""
    if path.suffix != ".safetensors":
        return sha256(path)
    digest = hashlib.sha256()
    tensors = load_file(str(path))
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def halvable(tensor: torch.Tensor) -> bool:
    """Whether a float32 tensor survives float16: finite, and no nonzero entry rounds to zero."""
    if tensor.dtype != torch.float32:
        return False
    half = tensor.to(torch.float16)
    return bool(torch.isfinite(half).all()) and not bool(((tensor != 0) & (half == 0)).any())


def pack_weights(source: Path, out: Path) -> list[str]:
    """`source` written to `out` with every halvable float32 tensor in float16; the names halved."""
    with safe_open(str(source), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(source))
    halved = sorted(name for name, tensor in tensors.items() if halvable(tensor))
    packed = {name: (tensor.to(torch.float16) if name in halved else tensor).contiguous()
              for name, tensor in tensors.items()}
    save_file(packed, str(out), metadata=metadata)
    return halved


def unpack_weights(stored: Path, out: Path, halved: list[str]) -> None:
    with safe_open(str(stored), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(stored))
    restored = {name: (tensor.to(torch.float32) if name in halved else tensor).contiguous()
                for name, tensor in tensors.items()}
    save_file(restored, str(out), metadata=metadata)


def corpus_fingerprint(train_files: list[tuple[str, bytes]]) -> str:
    """SHA-256 over the training files' relative paths and bytes, in order."""
    digest = hashlib.sha256()
    for name, data in train_files:
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()
