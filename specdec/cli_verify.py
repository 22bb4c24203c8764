"""`specdec verify --target DIR "prefix" "continuation"`: the verify probe from the shell, as
a table (and, with `--html FILE`, as a page)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specdec.cli_common import CLIError, add_model_options, load_target, one_line

__all__ = ["add_verify_command", "probe_html", "probe_text"]


def _show(tokenizer: Any, token: int) -> str:
    return repr(tokenizer.decode([token]))


def probe_text(result: Any, tokenizer: Any) -> str:
    """The probe as a text table, one line per continuation token."""
    lines = [f"{'pos':>3}  {'token':<16} {'p(token)':>8} {'rank':>5}  {'greedy verifier':<16} target top tokens"]
    for i, position in enumerate(result.positions):
        verdict = position.verdict
        if verdict == "rejected":
            verdict = f"REJECT -> {_show(tokenizer, result.correction)}"
        tops = "  ".join(f"{_show(tokenizer, t)} {p:.2f}" for t, p in position.top)
        lines.append(f"{i:>3}  {_show(tokenizer, position.token):<16} {position.probability:>8.3f} "
                     f"{position.rank:>5}  {verdict:<16} {tops}")
    tail = (f"all {len(result.positions)} accepted; the bonus token is {_show(tokenizer, result.correction)}"
            if result.bonus else f"{result.num_accepted} accepted, then the correction "
            f"{_show(tokenizer, result.correction)}")
    return "\n".join(lines + [tail])


def probe_html(result: Any, tokenizer: Any, prefix: str) -> str:
    """The probe as a self-contained page."""
    from specdec.html_page import chip, escape, page

    kinds = {"accepted": "accepted", "rejected": "rejected", "not reached": "notreached"}
    chips = [chip(prefix, "prompt", "prefix")]
    for position in result.positions:
        chips.append(chip(tokenizer.decode([position.token]), kinds[position.verdict],
                          f"p = {position.probability:.4f}, rank {position.rank}, {position.verdict}"))
        if position.verdict == "rejected":
            chips.append(chip(tokenizer.decode([result.correction]), "correction", "the verifier's correction"))
    if result.bonus:
        chips.append(chip(tokenizer.decode([result.correction]), "bonus", "bonus token: the target's next argmax"))
    rows = "".join(
        f"<tr><td>{i}</td><td>{chip(tokenizer.decode([p.token]), kinds[p.verdict])}</td><td>{p.probability:.3f}</td>"
        f"<td>{p.rank}</td><td>{escape(p.verdict)}</td><td>"
        + " ".join(f"{chip(tokenizer.decode([t]), 'plain')} {q:.2f}" for t, q in p.top) + "</td></tr>"
        for i, p in enumerate(result.positions))
    body = (f"<p>One target forward over the prefix and the continuation; each continuation token is checked "
            f"as the greedy verifier checks a draft token.</p><p>{''.join(chips)}</p>"
            f"<table><tr><th>pos</th><th>token</th><th>p(token)</th><th>rank</th><th>greedy verifier</th>"
            f"<th>target top tokens</th></tr>{rows}</table>")
    return page("specdec verify probe", body)


def _verify(args: argparse.Namespace) -> int:
    from specdec.probe import probe

    try:
        if args.target is None:
            from specdec import zoo

            target = zoo.build(zoo.QUICK if args.quick else zoo.FULL, root=args.cache_dir) / "target"
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
