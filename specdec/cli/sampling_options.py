"""The sampling flags the commands share (`--temperature` ... `--json-schema FILE`, `--regex`), and
the `specdec.Sampling` they make."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.cli.common import CLIError
from specdec.errors import one_line
from specdec.types import Sampling

__all__ = ["add_penalty_options", "add_verify_rule_option", "describe", "rules_for", "sampling_from"]


def add_verify_rule_option(parser: argparse.ArgumentParser, several: bool = False, default: str | None = None,
                           on_zoo: bool = False) -> None:
    """`--verify-rule`: the verification rule (`specdec.verifier.rules`; `default`, else the
    library's); with `several`, one or more (the bench adds a row per rule). With `on_zoo` the
    flag's default is None: the command takes the zoo family's rule on the family's own prompts
    (`rules_for`), the library's elsewhere."""
    from specdec.verifier.rules import DEFAULT_RULE, VERIFY_RULES

    chosen = default or DEFAULT_RULE
    told = f"{chosen}; on the zoo's own prompts, the rule of the family's figures" if on_zoo else chosen
    if several:
        parser.add_argument("--verify-rule", nargs="+", choices=VERIFY_RULES, default=None if on_zoo else [chosen],
                            metavar="RULE", help=f"verification rules, a row each ({', '.join(VERIFY_RULES)}; "
                                                 f"default {told})")
    else:
        parser.add_argument("--verify-rule", choices=VERIFY_RULES, default=None if on_zoo else chosen,
                            help=f"the verification rule (default {told}): block keeps more of a sampled chain, "
                                 "traversal of a sampled tree too; every rule is lossless")


def rules_for(told: list[str] | None, family_rule: str | None) -> tuple[str, ...]:
    """The rules a command runs: those told, else the family's (`family_rule`, when it decodes the
    zoo family's own evaluation, whose figures were measured under it), else the library's default."""
    from specdec.verifier.rules import DEFAULT_RULE

    if told:
        return tuple(told)
    return (family_rule or DEFAULT_RULE,)


def add_penalty_options(parser: argparse.ArgumentParser) -> None:
    """The settings beyond temperature, top-k and top-p (docs/learn.md, "Sampling settings")."""
    parser.add_argument("--min-p", type=float, default=0.0, help="drop ids below min-p times the top one (0: off)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="transformers' rule over the whole prefix (1.0: off)")
    parser.add_argument("--presence-penalty", type=float, default=0.0,
                        help="the OpenAI rule over the generated ids (0: off)")
    parser.add_argument("--frequency-penalty", type=float, default=0.0,
                        help="the OpenAI rule over the generated ids (0: off)")
    parser.add_argument("--json-schema", metavar="FILE", default=None,
                        help="constrain the output to the JSON schema in FILE")
    parser.add_argument("--regex", default=None, help="constrain the output to a regular expression")


def sampling_from(args: argparse.Namespace, temperature: float) -> Sampling:
    """The Sampling of the flags; a bad value or an unreadable schema file is a CLIError naming it."""
    schema = None
    if args.json_schema is not None:
        path = Path(args.json_schema)
        if not path.is_file():
            raise CLIError(f"--json-schema {args.json_schema!r} does not exist; give a file holding a JSON schema")
        try:
            schema = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise CLIError(f"--json-schema {args.json_schema!r} is not JSON: {one_line(error)}") from None
    try:
        return Sampling(temperature=temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
                        frequency_penalty=args.frequency_penalty, json_schema=schema, regex=args.regex)
    except ValueError as error:
        raise CLIError(one_line(error)) from None


def describe(sampling: Sampling) -> str:
    """The settings in words for a command's summary line: "greedy" or "temperature T", then those set."""
    words = ["greedy" if sampling.greedy else f"temperature {sampling.temperature:g}"]
    for name, value, off in (("top-k", sampling.top_k, 0), ("top-p", sampling.top_p, 1.0), ("min-p", sampling.min_p, 0.0),
                             ("repetition penalty", sampling.repetition_penalty, 1.0),
                             ("presence penalty", sampling.presence_penalty, 0.0),
                             ("frequency penalty", sampling.frequency_penalty, 0.0)):
        if value != off and not (sampling.greedy and name in ("top-k", "top-p", "min-p")):
            words.append(f"{name} {value:g}")
    if sampling.constraint is not None:
        words.append({"json_schema": "a JSON schema", "regex": "a regex", "grammar": "a grammar"}[sampling.constraint[0]])
    return ", ".join(words)
