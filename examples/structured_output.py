"""Structured output: which drafters shine when the answer is JSON to a schema.

    .venv/bin/python examples/structured_output.py                     # the shipped zoo, every drafter
    .venv/bin/python examples/structured_output.py --target DIR --drafter ngram --drafter suffix

Spec-Bench-style questions (examples/structured/question.jsonl: two per category, each asking for
its answer as JSON) are answered by every drafter through `specdec bench`'s session twice: as free
text, then constrained to examples/structured/answer_schema.json (`Sampling(json_schema=...)`, the
grammar engine masking p at every verify row and q at every drafted position). The table gives the
mean accepted length and the speedup over plain decoding of each drafter, without and with the
schema, each over plain decoding under the same settings. JSON repeats its keys, quotes and
brackets: suffix decoding copies them from the round's earlier answers, and drafters whose q the
grammar masks as it masks p (the draft model, EAGLE, MTP) gain where the schema leaves the target
little choice; docs/bench.md gives the figures on the shipped zoo, and why prompt lookup does not
gain there. Both passes write their bench files under --out (results.json records the settings,
the schema included).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "structured"


def _session(args: argparse.Namespace, target: Path, zoo_dir: Path | None, drafters: list[tuple[str, dict[str, Any]]],
             schema: dict[str, Any] | None, model: Any, tokenizer: Any, out: Path) -> dict[str, dict[str, Any]]:
    """One bench session; returns the records over all questions, by contender."""
    from specdec import Sampling
    from specdec.bench.session import BenchConfig, run_session

    config = BenchConfig(target=target, drafters=tuple(drafters), ks=(args.k,),
                         sampling=Sampling(temperature=args.temperature, json_schema=schema),
                         max_new_tokens=args.max_new_tokens, repeats=args.repeats, max_repeats=args.repeats,
                         warmup=args.warmup, peers=False, prompts=HERE / "question.jsonl", zoo=zoo_dir,
                         engines=("eager",) if args.eager else ("compiled",))
    records, _ = run_session(config, out, model, tokenizer)
    return {r["contender"]: r for r in records if r["category"] == "all"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None, help="a model directory (default: the zoo)")
    parser.add_argument("--quick", action="store_true", help="without --target: the quick zoo")
    parser.add_argument("--cache-dir", default=None, help="the zoo cache directory")
    parser.add_argument("--drafter", action="append", metavar="NAME[:key=value,...]",
                        help="repeatable (default: every zoo drafter, or ngram, suffix and lookahead on --target)")
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--eager", action="store_true", help="eager rows (default: compiled)")
    parser.add_argument("--out", default="structured-results", help="bench files: OUT/free and OUT/schema")
    args = parser.parse_args(argv)

    from specdec.cli.common import parse_drafter_spec
    from specdec.checkpoints import load_causal_lm, load_tokenizer

    zoo_dir = None
    if args.target is None:
        from specdec import zoo

        zoo_dir = zoo.ready(zoo.QUICK if args.quick else zoo.FULL, root=args.cache_dir, show_progress=False)
    target = Path(args.target) if args.target else zoo_dir / "target"  # type: ignore[operator]
    if args.drafter:
        from specdec.zoo import drafter_options

        known = drafter_options(zoo_dir) if zoo_dir is not None else {}
        drafters = [(name, {**known.get(name, {}), **options})
                    for name, options in (parse_drafter_spec(spec) for spec in args.drafter)]
    elif zoo_dir is not None:
        from specdec.bench.session import default_drafters, drafts_trees

        drafters, _ = default_drafters(zoo_dir)
        drafters = [(name, options) for name, options in drafters if not drafts_trees(name, options)]  # chains
    else:
        drafters = [("ngram", {}), ("suffix", {}), ("lookahead", {})]
    model, tokenizer = load_causal_lm(target), load_tokenizer(target)
    schema = json.loads((HERE / "answer_schema.json").read_text())
    out = Path(args.out)
    free = _session(args, target, zoo_dir, drafters, None, model, tokenizer, out / "free")
    constrained = _session(args, target, zoo_dir, drafters, schema, model, tokenizer, out / "schema")

    print(f"{len(drafters)} drafters, k = {args.k}, temperature {args.temperature}, {args.max_new_tokens} new tokens, "
          f"{'eager' if args.eager else 'compiled'}; each speedup over plain decoding with the same settings")
    header = f"{'drafter':<14} {'MAL free':>9} {'MAL schema':>11} {'speedup free':>13} {'speedup schema':>15}"
    print(header)
    print("-" * len(header))
    for label, row in free.items():
        if row["drafter"] is None:
            continue
        other = constrained[label]
        print(f"{label:<14} {row['mean_accepted_length']['median']:>9.2f} "
              f"{other['mean_accepted_length']['median']:>11.2f} {row['speedup']['median']:>12.2f}x "
              f"{other['speedup']['median']:>14.2f}x")
    print(f"plain tokens/s: free {free['plain']['tokens_per_second']['median']:.0f}, "
          f"schema {constrained['plain']['tokens_per_second']['median']:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
