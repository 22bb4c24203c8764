"""`specdec convert FILE.gguf --out DIR [--dtype float32]`: write a GGUF checkpoint as a float
checkpoint directory (config.json, model.safetensors, tokenizer files and chat template) that
every command and `specdec.checkpoints` read, and that tensor parallelism can shard
(`specdec.gguf.convert_gguf`)."""

from __future__ import annotations

import argparse
from typing import Any

from specdec.cli.common import CLIError
from specdec.errors import one_line

__all__ = ["add_convert_command"]

CONVERT_DTYPES = ("float32", "bfloat16", "float16")


def _convert(args: argparse.Namespace) -> int:
    import torch

    from specdec.checkpoints import quiet_transformers
    from specdec.gguf import convert_gguf

    try:
        with quiet_transformers():
            converted = convert_gguf(args.file, args.out, getattr(torch, args.dtype))
    except (OSError, ValueError, KeyError, ImportError) as error:
        raise CLIError(one_line(error)) from None
    print(f"converted {args.file} ({converted.architecture}) to {converted.directory}: "
          f"{converted.parameters:,} parameters in {args.dtype}")
    return 0


def add_convert_command(commands: Any) -> None:
    """Register `convert` under the top-level subparsers."""
    command = commands.add_parser("convert", help="write a GGUF checkpoint as a float checkpoint directory")
    command.add_argument("file", metavar="FILE.gguf", help="the GGUF file (llama.cpp's format); quantised weights "
                         "are dequantised")
    command.add_argument("--out", required=True, metavar="DIR", help="a new (or empty) directory for the checkpoint")
    command.add_argument("--dtype", choices=CONVERT_DTYPES, default="float32",
                         help="the dtype of the written weights (default float32)")
    command.set_defaults(run=_convert)
