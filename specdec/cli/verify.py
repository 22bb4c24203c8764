"""`specdec verify --target DIR "prefix" "continuation"`: the verify probe from the shell, as
a table (and, with `--html FILE`, as a page)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specdec.cli.common import CLIError, add_model_options, load_target
from specdec.errors import one_line

__all__ = ["add_verify_command"]


def _verify(args: argparse.Namespace) -> int:
    from specdec.teaching.probe import probe
    from specdec.teaching.probe_view import probe_html, probe_text

    try:
        if args.target is None:
            from specdec import zoo

            target = zoo.ready(zoo.QUICK if args.quick else zoo.FULL, root=args.cache_dir) / "target"
        else:
            target = Path(args.target)
        tokenizer, model = load_target(target, args)
        encode = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        result = probe(model, encode(args.prefix), encode(args.continuation), top=args.top)
    except (ValueError, OSError, KeyError) as error:
        raise CLIError(one_line(error)) from None
    print(probe_text(result, tokenizer))
    if args.html:
        Path(args.html).write_text(probe_html(result, tokenizer, args.prefix), encoding="utf-8")
        print(f"wrote {args.html}")
    return 0


def add_verify_command(commands: Any) -> None:
    """Register `verify` under the top-level subparsers."""
    verify = commands.add_parser("verify", help="one target forward: would the greedy verifier accept this text?")
    verify.add_argument("prefix", help="the text so far")
    verify.add_argument("continuation", help="the text to check, as if a drafter proposed it")
    verify.add_argument("--target", metavar="DIR|ORG/NAME", default=None, help="model + tokenizer (default: the zoo)")
    verify.add_argument("--quick", action="store_true", help="without --target: the quick zoo")
    verify.add_argument("--cache-dir", metavar="DIR", default=None)
    verify.add_argument("--top", type=int, default=5, help="target top tokens to show (default 5)")
    verify.add_argument("--html", metavar="FILE", default=None, help="also write the probe as a page")
    add_model_options(verify, compile=False)
    verify.set_defaults(run=_verify)
