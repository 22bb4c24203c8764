"""`specdec zoo build | extend | info | path | ship | figures`: train a model family here, add drafters to a built
or shipped one without training it again, show the shipped and the built families with their figures, and print a
piece's checkpoint directory for other commands to use."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from specdec.cli.common import CLIError
from specdec.intervals import Interval
from specdec.errors import one_line

__all__ = ["add_zoo_commands", "format_info"]


def _family(args: argparse.Namespace) -> Any:
    from specdec import zoo

    if args.hybrid:
        return zoo.HYBRID_QUICK if args.quick else zoo.HYBRID
    return zoo.QUICK if args.quick else zoo.FULL


def _build(args: argparse.Namespace) -> int:
    from specdec import zoo

    settings = _family(args)
    try:
        directory = zoo.build(settings, root=args.cache_dir, show_progress=not args.no_progress)
    except (OSError, ArithmeticError) as error:
        raise CLIError(f"zoo build failed: {one_line(error)}") from None
    print(directory)
    return 0


def _path(args: argparse.Namespace) -> int:
    from specdec import zoo

    try:
        print(zoo.piece_dir(_family(args), args.piece, root=args.cache_dir, built=args.built))
    except (ValueError, OSError) as error:
        raise CLIError(one_line(error)) from None
    return 0


def _number(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_info(record: dict[str, Any], directory: Path, figures: dict[str, Any] | None = None,
                origin: str = "built here") -> str:
    """A family's manifest and figures as text: where it is, how it was built, and a row per piece."""
    from specdec.zoo.options import registry_name

    corpus = record["corpus"]
    lines = [f"{record['name']} zoo ({record['key']}, {origin}): {directory}",
             f"  built in {record['build_seconds']:.0f} s on {record['threads']} threads; trained on "
             f"{corpus['train_tokens']:,} tokens of {corpus['train_files']} files, held out "
             f"{corpus['heldout_files']} files ({corpus['heldout_tokens']:,} tokens)"]
    t1 = record.get("target_forward_seconds")
    if t1 is not None:
        costs = record.get("costs", {})
        engine = "compiled" if costs.get("compiled") else "eager"
        lines.append(f"  one target forward T(1) = {t1 * 1e3:.3f} ms ({engine} engine, at build time); draft "
                     f"costs of greedy chains of k = {costs.get('k', 4)}")
    for extension in record.get("extensions", []):
        lines.append(f"  extended with {', '.join(extension['added'])} in {extension['seconds']:.0f} s on "
                     f"{extension['threads']} threads (their draft tax against T(1) = "
                     f"{extension['target_forward_seconds'] * 1e3:.3f} ms, measured then)")
    for name, piece in record["pieces"].items():
        if registry_name(name) != name:  # a row of a registered drafter on another piece
            vocabulary = f", a vocabulary of {piece['vocab_size']:,}" if "vocab_size" in piece else ""
            lines.append(f"  {name}: the {registry_name(name)} drafter on {piece['path']}/{vocabulary}")
    losses = (figures or {}).get("losses", {})
    acceptance = (figures or {}).get("drafters", {})
    if figures is not None:
        setting = figures["evaluation"]
        decoding = "greedy" if not setting["temperature"] else f"temperature {setting['temperature']}, seeded"
        text = figures["text"]
        lines.append(f"  mean accepted length: {setting['prompts']} held-out prompts, {decoding}, k = {setting['k']}, "
                     f"{setting['new_tokens']} new tokens, 95% bootstrap interval over prompts; rank: = where the "
                     f"intervals cannot order; from loops: the part of it from degenerate loops (plain decoding's "
                     f"text: {text['loop_share']:.0%} loop tokens, {text['degenerate']} of {text['prompts']} outputs "
                     "mostly loop)")
    header = ("piece", "parameters", "size MB", "held-out loss", "agreement", "mean acc. len [95%]", "rank",
              "from loops", "step / T(1)", "draft tax")
    rows = [header]
    for name, piece in record["pieces"].items():
        size = piece.get("bytes")
        loss = losses.get(name, {})
        accepted = acceptance.get(name)
        interval = accepted["mean_accepted_length"] if accepted else None
        cost = piece.get("draft_cost") or {}
        rows.append((name, f"{piece['parameters']:,}" if "parameters" in piece else "-",
                     "-" if size is None else f"{size / 1e6:.1f}", _number(loss.get("loss"), 3),
                     _number(loss.get("agreement"), 3),
                     "-" if interval is None else Interval.from_dict(interval).format(),
                     accepted["rank"] if accepted else "-", _number(accepted and accepted["from_loops"], 2),
                     _number(cost.get("step_ratio"), 3), _number(cost.get("draft_tax"), 2)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        lines.append("  " + "  ".join(cell.ljust(w) if j == 0 else cell.rjust(w) for j, (cell, w)
                                      in enumerate(zip(row, widths))))
        if i == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _info(args: argparse.Namespace) -> int:
    from specdec import zoo
    from specdec.zoo.shipped import SHIPPED

    shown = []
    for name in zoo.shipped_names():  # read where they ship: nothing is unpacked to list them
        shown.append((SHIPPED / name, "shipped with specdec"))
    root = zoo.cache_root(args.cache_dir)
    found = sorted(p.parent for p in root.glob("*/manifest.json")
                   if not p.parent.name.startswith(".") and "-shipped-" not in p.parent.name) if root.is_dir() else []
    shown += [(directory, "built here") for directory in found]
    for i, (directory, origin) in enumerate(shown):
        try:
            record = json.loads((directory / "manifest.json").read_text())
            text = format_info(record, directory, zoo.read_figures(directory), origin)
        except (OSError, ValueError, KeyError, TypeError) as error:
            text = f"{directory}: unreadable manifest ({one_line(error)})"
        print(("\n" if i else "") + text)
    if not found:
        print(f"\nno family built under {root}; `specdec zoo build` trains one here (or `--quick`, `--hybrid`)")
    return 0


def _ship(args: argparse.Namespace) -> int:
    """Store the family built here as the shipped one (maintainers: `docs/zoo.md`, *Shipping*)."""
    from specdec import zoo
    from specdec.zoo.shipped import SHIPPED, ship

    settings = _family(args)
    if settings.name not in ("full", "hybrid"):
        raise CLIError(f"the {settings.name} family does not ship (the full and hybrid ones do); drop --quick")
    built = zoo.family_dir(settings, args.cache_dir)
    if not zoo.finished(settings, args.cache_dir):
        raise CLIError(f"the {settings.name} family is not built under {zoo.cache_root(args.cache_dir)}; run "
                       f"`specdec zoo build{' --hybrid' if args.hybrid else ''}` first")
    try:
        ship(built, SHIPPED / settings.name)
    except (OSError, ValueError) as error:
        raise CLIError(f"zoo ship failed: {one_line(error)}") from None
    print(SHIPPED / settings.name)
    return 0


def _extend(args: argparse.Namespace) -> int:
    """Add the drafters this code's settings name to a family built with fewer (`specdec.zoo.extend`)."""
    from specdec import zoo
    from specdec.zoo.publish import rewrite_documents
    from specdec.zoo.shipped import SHIPPED

    settings = _family(args)
    if args.ship == (args.source is not None):
        raise CLIError("zoo extend takes one of --from DIR (a family built with fewer drafters) or --ship (the "
                       "shipped family, shipped again)")
    if args.ship and settings.name not in zoo.shipped_names():
        raise CLIError(f"the {settings.name} family does not ship (the shipped ones: "
                       f"{', '.join(zoo.shipped_names())}); use --from DIR")
    try:
        if args.ship:
            zoo.extend_shipped(settings, root=args.cache_dir, show_progress=not args.no_progress)
            changed = rewrite_documents()
            print(SHIPPED / settings.name)
            if changed:
                print("rewrote " + ", ".join(changed))
        else:
            print(zoo.extend(Path(args.source), settings, root=args.cache_dir, show_progress=not args.no_progress))
    except (OSError, ValueError, KeyError) as error:
        raise CLIError(f"zoo extend failed: {one_line(error)}") from None
    return 0


def _figures(args: argparse.Namespace) -> int:
    """`make docs-figures`: measure the shipped families and rewrite the docs' generated blocks."""
    from specdec.zoo.publish import publish, stale_blocks

    try:
        if args.check:
            stale = stale_blocks()
            for block in stale:
                print(f"stale: {block}")
            return 1 if stale else 0
        changed = publish(families=tuple(args.family) if args.family else None)
    except (OSError, ValueError, KeyError) as error:
        raise CLIError(f"zoo figures failed: {one_line(error)}") from None
    print("rewrote " + ", ".join(changed) if changed else "the docs' figures were already current")
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
                               help="train the family here, from scratch (reused when the cache already holds it)")
    build.add_argument("--no-progress", action="store_true", help="no progress bars")
    build.set_defaults(run=_build)
    extend = actions.add_parser("extend", parents=[cache, family],
                                help="add the drafters this code's settings name (draft-model-xtok, self, ...) to a "
                                     "family built with fewer, training only the new pieces")
    extend.add_argument("--from", dest="source", metavar="DIR", default=None,
                        help="the family directory to extend (the result goes into the cache)")
    extend.add_argument("--ship", action="store_true",
                        help="(maintainers) extend the shipped family and ship it again, then rewrite the docs' "
                             "generated figures")
    extend.add_argument("--no-progress", action="store_true", help="no progress bars")
    extend.set_defaults(run=_extend)
    info = actions.add_parser("info", parents=[cache],
                              help="the shipped and the built families, their pieces and figures")
    info.set_defaults(run=_info)
    path = actions.add_parser("path", parents=[cache, family], help="print a piece's checkpoint directory")
    path.add_argument("--built", action="store_true",
                      help="the family built here by `specdec zoo build`, not the shipped one")
    path.add_argument("piece", choices=list(PIECES), metavar="NAME", help=", ".join(PIECES))
    path.set_defaults(run=_path)
    ship = actions.add_parser("ship", parents=[cache, family],
                              help="(maintainers) store the family built here as the shipped one, in specdec/zoo/shipped-families")
    ship.set_defaults(run=_ship)
    figures = actions.add_parser("figures", help="(maintainers, `make docs-figures`) measure the shipped families and "
                                                 "rewrite the docs' generated figures")
    figures.add_argument("--family", action="append", metavar="NAME",
                         help="measure only this shipped family (repeatable; the docs are rendered from every one's)")
    figures.add_argument("--check", action="store_true",
                         help="only list the generated blocks that differ from the committed figures")
    figures.set_defaults(run=_figures)
