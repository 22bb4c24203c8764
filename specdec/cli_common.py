"""What every `specdec` subcommand shares: the user-error type and its one-line message, and the
options and loading of the models a command runs (`--device`, `--dtype`, `--compile`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

__all__ = ["DTYPES", "CLIError", "add_model_options", "load_target", "model_device", "one_line", "resolve_target"]

DTYPES = ("float32", "bfloat16", "float16", "float64")


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def one_line(error: BaseException) -> str:
    """The error's message on one line (its type name when it has none)."""
    return " ".join(str(error).split()) or type(error).__name__


def add_model_options(parser: argparse.ArgumentParser, compile: bool = True) -> None:
    """--device and --dtype (and --compile) for a command that runs a model."""
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda or cuda:1 (default cpu); "
                        "drafters follow the target")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="the target's dtype (default float32); probabilities stay float32")
    if compile:
        parser.add_argument("--compile", action="store_true",
                            help="compile the fixed-shape steps (torch.compile; CUDA graphs on CUDA)")
    parser.add_argument("--tp", type=int, default=1, metavar="N",
                        help="shard the target over N processes with tensor parallelism; launch with "
                             "torchrun --nproc_per_node N -m specdec ... (default 1: one process)")
    parser.add_argument("--check-ranks", action="store_true",
                        help="with --tp: gather every rank's draft and verdict each step and stop, naming the "
                             "ranks, when one differs from rank 0 (a debug check; costs two gathers a step)")


def model_device(text: str) -> Any:
    """The torch device `text` names; a CLIError when it is malformed or absent."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError as error:
        raise CLIError(f"--device {text!r} is not a torch device: {one_line(error)}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CLIError(f"--device {text!r} asks for CUDA but torch sees no CUDA device; use --device cpu")
    return device


def resolve_target(name: str | Path) -> Path:
    """The local directory of `--target name` (a directory or a hub id); a CLIError when there is
    none or it has no config.json."""
    from specdec.checkpoints import resolve_checkpoint

    try:
        path = resolve_checkpoint(name, "--target")
    except FileNotFoundError as error:
        raise CLIError(one_line(error)) from None
    if not (path / "config.json").is_file():
        raise CLIError(f"--target {str(name)!r} is not a model directory (no config.json in {str(path)!r})")
    return path


def load_target(name: str | Path, args: argparse.Namespace) -> tuple[Any, Any]:
    """(tokenizer, model in eval mode on args.device in args.dtype) from `--target name`, a
    checkpoint directory or a hub id."""
    import torch

    from specdec.checkpoints import load_causal_lm, load_tokenizer
    from specdec.ranks import CHECK_VARIABLE

    device = model_device(args.device)
    path = resolve_target(name)
    tp = getattr(args, "tp", 1)
    if getattr(args, "check_ranks", False):
        if tp == 1:
            raise CLIError("--check-ranks compares the ranks holding a sharded target; give --tp N under torchrun")
        os.environ[CHECK_VARIABLE] = "1"
    try:  # a --tp the model or the launch cannot take fails in load_causal_lm, before any weight is read
        tokenizer = load_tokenizer(path)
        model = load_causal_lm(path, dtype=getattr(torch, args.dtype), tp=tp)
    except (OSError, ValueError, KeyError) as error:
        raise CLIError(f"cannot load --target {str(name)!r}: {one_line(error)}") from None
    if tp != 1:  # transformers placed each shard on this rank's device
        return tokenizer, model.eval()
    return tokenizer, model.to(device).eval()

