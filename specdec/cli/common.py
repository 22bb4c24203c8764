"""What every `specdec` subcommand shares: the user-error type, the options and loading of the
models a command runs (`--device`, `--dtype`, `--compile`), drafter specs (`NAME:key=value,...`)
and the stats line."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from specdec import plugins
from specdec.errors import one_line
from specdec.runtime.quantize import SCHEMES
from specdec.types import Stats

__all__ = ["DTYPES", "CLIError", "add_model_options", "drafter_from_spec", "load_target", "model_device",
           "parse_drafter_spec", "parse_value", "quiet_registry", "resolve_target", "stats_line"]

DTYPES = ("float32", "bfloat16", "float16", "float64")


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def add_model_options(parser: argparse.ArgumentParser, compile: bool = True) -> None:
    """--device and --dtype (and --compile) for a command that runs a model."""
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda or cuda:1 (default cpu); "
                        "drafters follow the target")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="the target's dtype (default float32); probabilities stay float32")
    if compile:
        parser.add_argument("--compile", action="store_true",
                            help="compile the fixed-shape steps (torch.compile; CUDA graphs on CUDA)")
    parser.add_argument("--quantize", choices=SCHEMES, default=None,
                        help="quantize the target's linear layers once loaded: int8 weights with a scale per output "
                             "channel, bfloat16 activations (specdec.quantize; exact under speculation). A drafter "
                             "with a model of its own takes quantize=int8 in its spec")
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
    """The local directory of `--target name` (a directory or a hub id), or the GGUF file it names;
    a CLIError when there is none, a directory has no config.json, or transformers cannot read
    the GGUF file (`specdec.gguf.check_gguf`, which reads no weight)."""
    from specdec.checkpoints import resolve_checkpoint
    from specdec.gguf import check_gguf, is_gguf

    try:
        path = resolve_checkpoint(name, "--target")
        if is_gguf(path):
            check_gguf(path)
            return path
    except (OSError, ValueError) as error:  # GGUFDependencyError is a ValueError
        raise CLIError(one_line(error)) from None
    if not (path / "config.json").is_file():
        raise CLIError(f"--target {str(name)!r} is not a model directory (no config.json in {str(path)!r})")
    return path


def load_target(name: str | Path, args: argparse.Namespace) -> tuple[Any, Any]:
    """(tokenizer, model in eval mode on args.device in args.dtype) from `--target name`, a
    checkpoint directory, a GGUF file or a hub id."""
    import torch

    from specdec.checkpoints import load_causal_lm, load_tokenizer
    from specdec.distributed.ranks import CHECK_VARIABLE

    device = model_device(args.device)
    path = resolve_target(name)
    tp = getattr(args, "tp", 1)
    if tp != 1 and path.is_file():  # a GGUF file (resolve_target): fail before its tokenizer loads
        raise CLIError(f"--tp {tp}: --target {str(name)!r} is a GGUF file, which transformers cannot shard; convert "
                       f"it first with `specdec convert {str(name)} --out DIR` and pass --target DIR")
    if getattr(args, "check_ranks", False):
        if tp == 1:
            raise CLIError("--check-ranks compares the ranks holding a sharded target; give --tp N under torchrun")
        os.environ[CHECK_VARIABLE] = "1"
    try:  # a --tp the model or the launch cannot take fails in load_causal_lm, before any weight is read
        tokenizer = load_tokenizer(path)
        model = load_causal_lm(path, dtype=getattr(torch, args.dtype), tp=tp, quantize=getattr(args, "quantize", None))
    except (OSError, ValueError, KeyError, ImportError) as error:
        raise CLIError(f"cannot load --target {str(name)!r}: {one_line(error)}") from None
    if tp != 1:  # transformers placed each shard on this rank's device
        return tokenizer, model.eval()
    return tokenizer, model.to(device).eval()


def parse_value(text: str) -> int | float | bool | str:
    """A drafter option value: an int, a float, true/false (any case), else the string itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def parse_drafter_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split `NAME` or `NAME:key=value,key=value` into the name and its typed options.

    Values go through `parse_value`; a value may contain `=` and `:` but not `,`.
    Raises ValueError naming the malformed part.
    """
    name, colon, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"drafter spec {spec!r} has no name; write NAME or NAME:key=value,...")
    options: dict[str, Any] = {}
    if not colon:
        return name, options
    if not rest.strip():
        raise ValueError(f"drafter spec {spec!r} has nothing after ':'; write NAME:key=value,... or just NAME")
    for item in rest.split(","):
        key, equals, value = item.partition("=")
        key = key.strip()
        if not equals or not key.isidentifier():
            raise ValueError(f"drafter option {item!r} in {spec!r} is not key=value (key a Python identifier)")
        if key in options:
            raise ValueError(f"drafter option {key!r} is given twice in {spec!r}")
        options[key] = parse_value(value)
    return name, options


def quiet_registry() -> plugins.Registry:
    """The process registry; plugin failures are shown by the commands, not as warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            return plugins.registry()
        except plugins.DuplicateDrafterError as error:
            raise CLIError(one_line(error)) from None



def drafter_from_spec(spec: str | None) -> Any:
    if spec is None:
        return None
    try:
        name, options = parse_drafter_spec(spec)
    except ValueError as error:
        raise CLIError(one_line(error)) from None
    registry = quiet_registry()
    for failure in registry.failures:
        print(f"specdec: warning: plugin {failure.plugin!r} skipped: {failure.error}", file=sys.stderr)
    try:
        return plugins.make_drafter(name, **options)
    except (ValueError, TypeError, OSError) as error:
        raise CLIError(one_line(error)) from None


def stats_line(stats: Stats) -> str:
    """One line of a generation's counters, as key=value pairs."""
    return (f"stats: steps={stats.steps} new_tokens={stats.new_tokens} "
            f"mean_accepted_length={stats.mean_accepted_length:.2f} acceptance_rate={stats.acceptance_rate:.3f} "
            f"tokens_per_second={stats.tokens_per_second:.1f} draft_seconds={stats.draft_seconds:.3f} "
            f"verify_seconds={stats.verify_seconds:.3f}")


