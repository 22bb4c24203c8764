"""The `specdec` command line: list the registered drafters, generate from a checkpoint.

    specdec drafters
    specdec generate --target DIR|ORG/NAME [--drafter NAME[:key=value,...]] [--k 4] [--chat] "prompt"
    specdec generate --target DIR --drafter eagle:path=HEAD --prompts FILE   # a batch: one prompt per line
    specdec zoo {build,info,path,ship,figures} (specdec.cli.zoo)
    specdec train KIND --target DIR --data PATH... --out DIR   (specdec.cli.train)
    specdec bench [--target DIR] [--drafter SPEC]... [--k 4 auto]  (specdec.cli.bench)
    specdec bench-real [--drafters DIR]                         (specdec.cli.bench_real; make bench-real)
    specdec train-real [--out DIR]                              (specdec.cli.train_real; make train-real)
    specdec verify [--target DIR] "prefix" "continuation"       (specdec.cli.verify)
    specdec trace [--target DIR] [--drafter SPEC] ["prompt"]     (specdec.cli.trace)
    specdec datastore build FILES... --tokenizer DIR --out DIR   (specdec.cli.datastore)

User errors print one line, `specdec: error: ...`, and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from specdec.cli.bench import add_bench_command
from specdec.cli.bench_real import add_bench_real_command
from specdec.cli.common import CLIError
from specdec.cli.convert import add_convert_command
from specdec.cli.datastore import add_datastore_commands
from specdec.cli.drafters import add_drafters_command
from specdec.cli.export import add_export_command
from specdec.cli.generate import add_generate_command
from specdec.cli.play import add_play_command
from specdec.cli.trace import add_trace_command
from specdec.cli.train import add_train_command
from specdec.cli.train_real import add_train_real_command
from specdec.cli.verify import add_verify_command
from specdec.cli.zoo import add_zoo_commands
from specdec.distributed.sharding import rank_zero_output

__all__ = ["main"]

COMMANDS = (add_drafters_command, add_generate_command, add_zoo_commands, add_train_command, add_bench_command,
            add_verify_command, add_trace_command, add_export_command, add_datastore_commands, add_play_command,
            add_convert_command, add_bench_real_command, add_train_real_command)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding with pluggable drafters.")
    commands = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")
    for add_command in COMMANDS:
        add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (argparse exits 2 itself on bad syntax)."""
    args = _parser().parse_args(argv)
    with rank_zero_output():
        try:
            return args.run(args)
        except CLIError as error:
            print(f"specdec: error: {error}", file=sys.stderr)
            return 2
