"""`make demo`: every drafter of the zoo, side by side, on held-out code prompts.

The first run builds the zoo (`specdec zoo build`: a tokenizer, a 32-layer Qwen3-architecture
target with an MTP module, a draft model, Medusa heads, an EAGLE-1 and an EAGLE-3 head, all trained
here on the standard library's source, and a retrieval datastore of that text, with progress
bars); later runs reuse it from the cache. Then every drafter, the training-free ones (ngram,
lookahead, suffix, retrieval) and the learned ones, decodes the same held-out prompts (a function
signature and docstring, a class header, a half-written function) greedily with k draft tokens
per step, interleaved with plain decoding of the same target, once drafting chains and once
drafting token trees (NAME+tree, `docs/trees.md`). The table gives per drafter:

- mean acc. len: tokens emitted per target forward, the bonus token included;
- acceptance: accepted over drafted tokens;
- speedup: plain decoding's time over the drafter's, for the same prompts and tokens;
- same as plain: whether the tokens equal plain greedy decoding's (lossless: they must).

Below the table, one line per drafter gives its draft tax, measured in the same rounds: one
draft step's cost (a drafter forward; the whole draft for a model-free drafter) against one
target forward of plain decoding, and what a draft of k tokens costs in target forwards.

Then the Qwen3.5 case: the zoo's hybrid family (`specdec zoo build --hybrid`: a target in Qwen3.5's
layout, three GatedDeltaNet linear-attention layers to one full-attention layer, trained with one
MTP module) decodes the same prompts plainly and with its MTP module drafting chains and trees,
compiled: the linear layers keep each draft row's state and the commit takes the accepted one
(`docs/engine.md`), with its draft tax below.

Tokens/s and speedup are wall-clock figures of small models on a CPU, where each forward's
fixed cost is large; mean accepted length is the machine-independent number. Decoding runs on
the compiled engine (`docs/engine.md`; `--eager` for the eager one); the warm-up round compiles,
outside the timings.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import specdec
from specdec import plugins, zoo
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.data.corpus import stdlib_corpus
from specdec.data.prompts import code_prompts
from specdec.protocols import forget
from specdec.training.optim import progress
from specdec.types import Stats, total_stats
from specdec.zoo.costs import model_steps

HEADER = ("drafter", "new tokens", "target forwards", "mean acc. len", "acceptance", "tokens/s", "speedup",
          "same as plain")
CHAINS = ("ngram", "lookahead", "suffix", "retrieval", "draft-model", "medusa", "eagle", "eagle3", "mtp")
DRAFTERS = tuple(label for name in CHAINS for label in (name, f"{name}+tree"))  # NAME+tree: its token-tree mode
HYBRID_DRAFTERS = ("mtp", "mtp+tree")  # the hybrid family's story: its MTP module, chains and trees


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    drafter: str
    stats: Stats
    seconds: float  # median over repeats of the time for all prompts
    speedup: float
    same_as_plain: bool


def decode(target: specdec.CausalLM, prompts: list[torch.Tensor], drafter: Any, k: int, new_tokens: int,
           compile: bool) -> tuple[list[list[int]], Stats]:
    """Greedy decoding of every prompt with `drafter` (None: plain); tokens and summed counters.
    A drafter that remembers earlier generations (suffix) forgets the previous rounds first."""
    forget(drafter)
    outputs, runs = [], []
    for prompt in prompts:
        result = specdec.generate(target, prompt, drafter=drafter, num_draft_tokens=k, max_new_tokens=new_tokens,
                                  compile=compile)
        outputs.append(result.tokens)
        runs.append(result.stats)
    return outputs, total_stats(runs)


def drafter_options(directory: Path, labels: tuple[str, ...] = DRAFTERS) -> dict[str, dict[str, Any]]:
    """The zoo's options for each of `labels`; NAME+tree adds the drafter's tree options."""
    options = zoo.drafter_options(directory)
    for label in labels:
        name, _, tree = label.partition("+")
        if tree:
            options[label] = {**options[name], **plugins.drafter_class(name).tree_options}
    return options


def compare(target: specdec.CausalLM, prompts: list[torch.Tensor], directory: Path, args: argparse.Namespace,
            labels: tuple[str, ...] = DRAFTERS) -> list[Row]:
    """Plain decoding and each drafter of `labels`, `args.repeats` interleaved rounds; median times.
    Each drafter is made once (its prefill resets it), so its compiled steps replay in every
    round. A bar on stderr names the row being decoded (`--no-progress` hides it)."""
    options = drafter_options(directory, labels)
    names: list[str | None] = [None, *labels]
    drafters = {name: None if name is None else specdec.make_drafter(name.partition("+")[0], **options[name])
                for name in names}
    compile = not args.eager
    bar = progress(len(names) * (1 + args.repeats), "decoding", not args.no_progress)
    bar.unit = "row"
    for name in names:  # warm-up: compiling and other one-off costs stay out of the timings
        bar.set_description(f"warm-up{' (compiling)' if compile else ''}: {name or 'plain'}")
        decode(target, prompts, drafters[name], args.k, args.new_tokens, compile)
        bar.update(1)
    times: dict[str | None, list[float]] = {name: [] for name in names}
    results: dict[str | None, tuple[list[list[int]], Stats]] = {}
    for round_number in range(1, args.repeats + 1):
        for name in names:
            bar.set_description(f"round {round_number}/{args.repeats}: {name or 'plain'}")
            results[name] = decode(target, prompts, drafters[name], args.k, args.new_tokens, compile)
            times[name].append(results[name][1].wall_seconds)
            bar.update(1)
    bar.close()
    plain_tokens, _ = results[None]
    plain_time = statistics.median(times[None])
    rows = []
    for name in names:
        tokens, stats = results[name]
        seconds = statistics.median(times[name])
        rows.append(Row(name or "plain", stats, seconds, plain_time / seconds, tokens == plain_tokens))
    return rows


def table(rows: list[Row]) -> str:
    """The rows as an aligned text table, one header line and a rule."""
    cells = [HEADER] + [
        (r.drafter, str(r.stats.new_tokens), str(r.stats.steps), f"{r.stats.mean_accepted_length:.2f}",
         "-" if r.drafter == "plain" else f"{r.stats.acceptance_rate:.0%}",
         f"{r.stats.new_tokens / r.seconds:.0f}", f"{r.speedup:.2f}x", "yes" if r.same_as_plain else "NO")
        for r in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADER))]
    render = lambda line: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                    for i, (c, w) in enumerate(zip(line, widths)))
    return "\n".join([render(cells[0]), "  ".join("-" * w for w in widths)] + [render(c) for c in cells[1:]])


def draft_taxes(rows: list[Row], k: int) -> str:
    """One line per drafter: one draft step's seconds against one plain target forward (from the
    rows' own counters: drafting seconds per verify step, over the drafter forwards of a draft)."""
    plain = next(r for r in rows if r.drafter == "plain").stats
    forward = plain.verify_seconds / plain.steps  # one target forward of one token
    lines = [f"Draft tax (one target forward: {forward * 1e3:.3f} ms):"]
    for row in rows:
        if row.drafter == "plain" or not row.stats.steps:
            continue
        name = row.drafter.partition("+")[0]
        draft = row.stats.draft_seconds / row.stats.steps  # per verify step
        forwards = model_steps(name, k) if "+" not in row.drafter else 0
        if forwards:
            step = draft / forwards
            what = (f"one draft step {step * 1e3:.3f} ms = {step / forward:.3f} of a target forward; "
                    f"a draft of {forwards} step{'s' if forwards > 1 else ''}")
        else:
            what = "the whole draft" + (" (a tree)" if "+" in row.drafter else "")
        lines.append(f"  {row.drafter:<17} {what} costs {draft / forward:.2f} target forwards")
    return "\n".join(lines)


def losses(directory: Path) -> str:
    """The held-out losses the build recorded, one line."""
    record = zoo.manifest(directory)
    pieces = record["pieces"]
    parts = [f"{name} {pieces[name]['heldout_loss']:.2f}" for name in ("target", "draft-model", "medusa", "eagle",
                                                                        "eagle3", "mtp") if name in pieces]
    return (f"{record['name']} zoo ({directory}), built in {record['build_seconds']:.0f} s; held-out loss "
            f"(nats/token): {', '.join(parts)}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the quick zoo (built in under a minute)")
    parser.add_argument("--cache-dir", default=None, help="zoo cache directory (default: the user cache)")
    parser.add_argument("--prompts", type=int, default=2, help="held-out prompts per category (default 2)")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens to generate per prompt")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step (default 4)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds; the median counts (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for decoding (default 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (building, decoding)")
    parser.add_argument("--eager", action="store_true", help="decode eagerly (default: the compiled engine)")
    parser.add_argument("--family", choices=("both", "main", "hybrid"), default="both",
                        help="the zoo families shown: the main one (every drafter), the hybrid one (MTP on a "
                             "Qwen3.5-layout target), or both (default)")
    args = parser.parse_args(argv)
    for field in ("prompts", "new_tokens", "k", "repeats", "threads"):
        if getattr(args, field) < 1:
            parser.error(f"--{field.replace('_', '-')} must be >= 1, got {getattr(args, field)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    prompts = code_prompts(stdlib_corpus(), per_category=args.prompts)
    exact = True
    if args.family in ("both", "main"):
        exact &= show_family(zoo.QUICK if args.quick else zoo.FULL, prompts, args, DRAFTERS, example=True)
    if args.family in ("both", "hybrid"):
        settings = zoo.HYBRID_QUICK if args.quick else zoo.HYBRID
        size = settings.target
        print(f"\nThe Qwen3.5 case: a hybrid target of {size.layers} layers ({size.layers * 3 // 4} GatedDeltaNet "
              f"linear-attention, {size.layers // 4} full-attention) and one MTP module, drafting chains and trees.")
        exact &= show_family(settings, prompts, args, HYBRID_DRAFTERS, example=False)
    print(f"\nTotal {time.perf_counter() - began:.0f} s.")
    return 0 if exact else 1


def show_family(settings: zoo.ZooSettings, prompts: list[Any], args: argparse.Namespace, labels: tuple[str, ...],
                example: bool) -> bool:
    """Build (or load) one family, decode the prompts plainly and with each of `labels`, print its
    table and draft taxes; whether every drafter reproduced plain decoding."""
    directory = zoo.build(settings, root=args.cache_dir, show_progress=not args.no_progress)
    tokenizer = load_tokenizer(directory / "target")
    target = specdec.CausalLM(load_causal_lm(directory / "target"))
    ids = [torch.tensor(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in prompts]
    print(losses(directory))
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        if example:
            first = decode(target, ids[:1], None, args.k, args.new_tokens, not args.eager)[0][0]
            print(f"\nHeld-out prompt {prompts[0].source} and the target's greedy continuation:")
            print(f"{prompts[0].text}\033[2m{tokenizer.decode(first)}\033[0m" if sys.stdout.isatty()
                  else prompts[0].text + tokenizer.decode(first), flush=True)
        rows = compare(target, ids, directory, args, labels)
    finally:
        torch.set_num_threads(previous)
    print(f"\n{len(prompts)} held-out prompts ({', '.join(sorted({p.category for p in prompts}))}), greedy, "
          f"k = {args.k}, {args.new_tokens} new tokens each, {args.threads} thread(s), "
          f"{'eager' if args.eager else 'compiled'}; median of {args.repeats}:")
    print(table(rows))
    print()
    print(draft_taxes(rows, args.k))
    return all(r.same_as_plain for r in rows)


if __name__ == "__main__":
    sys.exit(main())
