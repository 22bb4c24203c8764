"""`specdec zoo build | info | path`: build the embedded model family, show what is cached, and
print a piece's checkpoint directory for other commands to use."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from specdec.cli.common import CLIError
from specdec.errors import one_line

__all__ = ["add_zoo_commands", "format_info"]


def _family(args: argparse.Namespace) -> Any:
    from specdec import zoo

    if args.hybrid:
        return zoo.HYBRID_QUICK if args.quick else zoo.HYBRID
    return zoo.QUICK if args.quick else zoo.FULL


def _build(args: argparse.Namespace) -> int:
    from specdec import zoo

    try:
        directory = zoo.build(_family(args), root=args.cache_dir, show_progress=not args.no_progress)
    except (OSError, ArithmeticError) as error:
        raise CLIError(f"zoo build failed: {one_line(error)}") from None
    print(directory)
    return 0


def _path(args: argparse.Namespace) -> int:
    from specdec import zoo

    try:
        print(zoo.piece_dir(_family(args), args.piece, root=args.cache_dir))
    except (ValueError, FileNotFoundError) as error:
        raise CLIError(one_line(error)) from None
    return 0


def _number(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_info(record: dict[str, Any], directory: Path) -> str:
    """A family's manifest as text: where it is, how it was built, and a row per piece."""
    corpus = record["corpus"]
    lines = [f"{record['name']} zoo ({record['key']}): {directory}",
             f"  built in {record['build_seconds']:.0f} s on {record['threads']} threads; trained on "
             f"{corpus['train_tokens']:,} tokens of {corpus['train_files']} files, held out "
             f"{corpus['heldout_files']} files ({corpus['heldout_tokens']:,} tokens)"]
    t1 = record.get("target_forward_seconds")
    if t1 is not None:
        costs = record.get("costs", {})
        engine = "compiled" if costs.get("compiled") else "eager"
        lines.append(f"  one target forward T(1) = {t1 * 1e3:.3f} ms ({engine} engine); draft costs of greedy "
                     f"chains of k = {costs.get('k', 4)}")
    header = ("piece", "parameters", "size MB", "held-out loss", "agreement", "mean acc. len (k=4)", "step ms",
              "step / T(1)", "draft tax")
    rows = [header]
    for name, piece in record["pieces"].items():
        size = piece.get("bytes")
        agreement = (piece.get("heldout") or {}).get("agreement")
        cost = piece.get("draft_cost") or {}
        step = cost.get("step_seconds")
        rows.append((name, f"{piece['parameters']:,}" if "parameters" in piece else "-",
                     "-" if size is None else f"{size / 1e6:.1f}", _number(piece.get("heldout_loss"), 3),
                     _number(agreement, 3), _number(piece.get("mean_accepted_length"), 2),
                     "-" if step is None else f"{step * 1e3:.3f}", _number(cost.get("step_ratio"), 3),
                     _number(cost.get("draft_tax"), 2)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        lines.append("  " + "  ".join(cell.ljust(w) if j == 0 else cell.rjust(w) for j, (cell, w)
                                      in enumerate(zip(row, widths))))
        if i == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _info(args: argparse.Namespace) -> int:
    from specdec import zoo

    root = zoo.cache_root(args.cache_dir)
    found = sorted(p for p in root.glob("*/manifest.json") if not p.parent.name.startswith(".")) \
        if root.is_dir() else []
    if not found:
        print(f"no zoo built under {root}; run `specdec zoo build` (or `--quick`, `--hybrid`)")
        return 0
    for i, file in enumerate(found):
        try:
            record = json.loads(file.read_text())
            text = format_info(record, file.parent)
        except (OSError, ValueError, KeyError, TypeError) as error:
            text = f"{file.parent}: unreadable manifest ({one_line(error)})"
        print(("\n" if i else "") + text)
    return 0


def add_zoo_commands(commands: Any) -> None:
    """Register `zoo build`, `zoo info` and `zoo path` under the top-level subparsers."""
    from specdec.zoo.store import PIECES

    zoo = commands.add_parser("zoo", help="build and locate the model family specdec trains itself")
    actions = zoo.add_subparsers(dest="zoo_command", required=True, metavar="ACTION")
    cache = argparse.ArgumentParser(add_help=False)
    cache.add_argument("--cache-dir", metavar="DIR", default=None,
                       help="zoo cache (default $XDG_CACHE_HOME/specdec/zoo, else ~/.cache/specdec/zoo)")
    family = argparse.ArgumentParser(add_help=False)
    family.add_argument("--quick", action="store_true", help="the small family built in under a minute")
    family.add_argument("--hybrid", action="store_true",
                        help="the Qwen3.5-layout family: a hybrid target (GatedDeltaNet linear attention beside full "
                             "attention, 3 : 1) with its MTP module, draft-model, eagle3, ngram and suffix")
    build = actions.add_parser("build", parents=[cache, family],
                               help="train the family (reused when the cache already holds it)")
    build.add_argument("--no-progress", action="store_true", help="no progress bars")
    build.set_defaults(run=_build)
    info = actions.add_parser("info", parents=[cache], help="list the built families and their pieces")
    info.set_defaults(run=_info)
    path = actions.add_parser("path", parents=[cache, family], help="print a piece's checkpoint directory")
    path.add_argument("piece", choices=list(PIECES), metavar="NAME", help=", ".join(PIECES))
    path.set_defaults(run=_path)
