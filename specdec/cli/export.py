"""`specdec export KIND SRC --to ENGINE --out DIR [--target DIR]`: write a drafter in the checkpoint
layout vLLM or SGLang loads (`specdec.export`; docs/export.md)."""

from __future__ import annotations

import argparse
from typing import Any

from specdec.cli.common import CLIError
from specdec.errors import one_line

__all__ = ["add_export_command"]


def _export(args: argparse.Namespace) -> int:
    from specdec.export import export

    try:
        out = export(args.kind, args.src, args.to, args.out, target=args.target)
    except (ValueError, KeyError, OSError) as error:
        raise CLIError(one_line(error)) from None
    print(f"exported {args.kind} for {args.to} to {out}")
    return 0


def add_export_command(commands: Any) -> None:
    """Register `export` under the top-level subparsers."""
    from specdec.export import ENGINES, EXPORTERS

    kinds = sorted(EXPORTERS)
    command = commands.add_parser("export", help="write a drafter in the layout vLLM or SGLang loads")
    command.add_argument("kind", choices=kinds, metavar="KIND", help=", ".join(kinds))
    command.add_argument("src", metavar="SRC", help="the drafter's specdec checkpoint directory (mtp: the target "
                         "checkpoint holding the module)")
    command.add_argument("--to", required=True, choices=ENGINES, help=" or ".join(ENGINES))
    command.add_argument("--out", required=True, metavar="DIR", help="a new (or empty) directory for the export")
    command.add_argument("--target", default=None, metavar="DIR",
                         help="the target checkpoint: mtp copies it (default SRC); others are checked to fit it")
    command.set_defaults(run=_export)
