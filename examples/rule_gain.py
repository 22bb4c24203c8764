"""How many more draft tokens block and traversal verification keep than token-wise rules, on the
same drafts: every learned drafter of the zoo decodes its held-out prompts (verified token-wise),
and at each step `RuleExpectations` asks what each rule keeps on average from that step's draft
and target rows (`specdec.verifier.expected_accepted`, exact: no sampling noise of the rules'
own). Rows: argmax drafting (sample-and-match), sampled chains (token-wise against block),
sampled trees with siblings i.i.d. and without replacement (the sibling rule against traversal).

    .venv/bin/python examples/rule_gain.py [--quick] [--temperature 0.6 1.0] [--prompts-per-category 2]

The figure per rule is the mean accepted length on those drafts, 1 + E[kept] per step (the
correction or bonus token counted), and the gain of the better rule over the token-wise one.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import specdec
from specdec import zoo
from specdec.teaching.rule_compare import RuleExpectations

# (row label, drafter, options): chains then trees; argmax drafting where the drafter offers it
ROWS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    *((f"{name} argmax", name, {"sample": False}) for name in ("draft-model", "eagle", "eagle3", "mtp", "medusa")),
    *((f"{name} sampled", name, {"sample": True}) for name in ("draft-model", "eagle", "eagle3", "mtp", "medusa")),
    *((f"{name}+tree {siblings}", name, {"sample": True, "tree": True, "siblings": siblings})
      for name in ("draft-model", "eagle", "eagle3", "mtp", "medusa") for siblings in ("iid", "without_replacement")),
)


def rule_means(model: Any, prompts: list[list[int]], drafter: Any, temperature: float, new_tokens: int
               ) -> dict[str, float]:
    """Mean 1 + E[kept] per step of each rule, over every step of every prompt (seed = its index)."""
    per_rule: dict[str, list[float]] = {}
    for seed, prompt in enumerate(prompts):
        trace = RuleExpectations()
        specdec.generate(model, prompt, drafter=drafter, max_new_tokens=new_tokens,
                         sampling=specdec.Sampling(temperature=temperature), seed=seed, trace=trace)
        for step in trace.expectations:
            for rule, kept in step.items():
                per_rule.setdefault(rule, []).append(1.0 + kept)
    return {rule: statistics.fmean(values) for rule, values in per_rule.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the quick zoo (default: the shipped full one)")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.6, 1.0])
    parser.add_argument("--prompts-per-category", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--rows", nargs="+", default=None, metavar="LABEL", help="only these rows (default: all)")
    args = parser.parse_args(argv)
    from specdec.checkpoints import load_causal_lm
    from specdec.data.corpus import stdlib_corpus
    from specdec.data.prompts import code_prompts
    from transformers import AutoTokenizer

    directory = zoo.ready(zoo.QUICK if args.quick else zoo.FULL, root=args.cache_dir)
    options = zoo.drafter_options(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory / "tokenizer")
    model = load_causal_lm(directory / "target").eval()
    texts = [p.text for p in code_prompts(stdlib_corpus(), per_category=args.prompts_per_category)]
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    print(f"{len(prompts)} held-out prompts, {args.new_tokens} new tokens; mean accepted length on the same drafts")
    print(f"{'drafter':<36} {'T':>4}  {'token':>6}  {'block/traversal':>15}  gain")
    for temperature in args.temperature:
        for label, name, own in ROWS:
            if name not in options or (args.rows and label not in args.rows):
                continue
            drafter = specdec.make_drafter(name, **{**options[name], **own})
            means = rule_means(model, prompts, drafter, temperature, args.new_tokens)
            better = means.get("block", means.get("traversal", 0.0))
            print(f"{label:<36} {temperature:>4}  {means['token']:>6.3f}  {better:>15.3f}  "
                  f"{100 * (better / means['token'] - 1):+.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
