"""`specdec datastore build FILES... --tokenizer DIR --out DIR`: tokenise text files and write the
suffix-array datastore the `retrieval` drafter (REST) drafts from (`specdec.data.datastore`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from specdec.cli.common import CLIError
from specdec.errors import one_line

__all__ = ["add_datastore_commands"]


def _build(args: argparse.Namespace) -> int:
    from specdec.checkpoints import load_tokenizer
    from specdec.data.datastore import open_datastore
    from specdec.data.datastore_build import build_datastore

    start = time.perf_counter()
    files = [Path(name) for name in args.files]
    for file in files:  # before loading anything
        if not file.is_file():
            raise CLIError(f"input file {str(file)!r} " + ("is a directory; pass its files (e.g. DIR/*.txt)"
                                                           if file.is_dir() else "does not exist"))
    try:
        tokenizer = load_tokenizer(args.tokenizer)
    except (OSError, ValueError) as error:
        raise CLIError(f"cannot load --tokenizer {args.tokenizer!r}: {one_line(error)}") from None
    say = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        out = build_datastore(files, tokenizer, args.out, log=say)
        store = open_datastore(out, verify=False)
    except (ValueError, OSError) as error:
        raise CLIError(one_line(error)) from None
    manifest = store.manifest
    print(f"wrote datastore {out}: {store.suffixes.size:,} tokens in {manifest['num_documents']:,} documents "
          f"from {len(files)} files, vocab {store.vocab_size}, {manifest['token_dtype']} ids and "
          f"{manifest['index_dtype']} suffixes, in {time.perf_counter() - start:.1f} s")
    return 0


def add_datastore_commands(commands: Any) -> None:
    """Register `datastore build` under the top-level subparsers."""
    command = commands.add_parser("datastore", help="build the retrieval drafter's datastore (REST)")
    actions = command.add_subparsers(dest="datastore_command", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="tokenise text files into a suffix-array datastore")
    build.add_argument("files", nargs="+", metavar="FILE", help="UTF-8 text files, one document each")
    build.add_argument("--tokenizer", required=True, metavar="DIR|ORG/NAME",
                       help="the target's tokenizer: a local directory or a hub id")
    build.add_argument("--out", required=True, metavar="DIR", help="a new (or empty) directory for the datastore")
    build.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    build.set_defaults(run=_build)
