"""`make demo`: every drafter of the zoo, side by side, on held-out code prompts.

The zoo ships with specdec (`specdec.zoo.shipped`): a tokenizer, a 32-layer Qwen3-architecture
target with an MTP module, a draft model, a draft model on a tokenizer of its own (draft-model-xtok:
drafting across vocabularies), Medusa heads, an EAGLE-1 and an EAGLE-3 head, all trained by specdec
on the standard library's source, and a retrieval datastore of that text, rebuilt from its recipe on
first use. Every machine decodes with the same bytes, so the accepted lengths below are the ones
`docs/zoo.md` publishes. Every drafter, the training-free ones (ngram, lookahead, suffix, retrieval,
and self: the target drafting with some of its own layers) and the learned ones, decodes the
family's evaluation prompts (held-out function signatures, class headers and half-written functions)
at the family's temperature with a fixed seed per prompt, k draft tokens per step, interleaved
prompt by prompt with plain decoding of the same target, once drafting chains and once drafting
token trees (NAME+tree, `docs/trees.md`; the drafters that draft trees). Sampled, because the zoo's
small target decoded greedily falls into loops ("is a file is a file ..."), which any drafter
predicts (`docs/zoo.md`, *Figures*). The table gives per drafter:

- mean acc. len: tokens emitted per target forward, the bonus token included, with its 95%
  bootstrap interval over prompts; rank: its place by it, `=` where the paired intervals cannot
  order it against another (`specdec.intervals`);
- from loops: the part of the mean accepted length made of loop tokens (`specdec.data.loops`);
- acceptance: accepted over drafted tokens;
- speedup: plain decoding's time over the drafter's for the same prompts, with its interval and
  the rank it supports;
- lossless: whether, decoding greedily, the tokens equal plain greedy decoding's (they must:
  the sampled rows are exact in distribution, which `tests/test_lossless_statistical.py` checks).

Below the table, one line per drafter gives its draft tax, measured in the same rounds: one
draft step's cost (a drafter forward; the whole draft for a model-free drafter) against one
target forward of plain decoding, and what a draft of k tokens costs in target forwards.

Then the Qwen3.5 case: the zoo's hybrid family (also shipped: a target in Qwen3.5's layout, three
GatedDeltaNet linear-attention layers to one full-attention layer, trained with one MTP module)
decodes the same way plainly and with its MTP module drafting chains and trees, compiled: the
linear layers keep each draft row's state and the commit takes the accepted one
(`docs/engine.md`), with its draft tax below.

Tokens/s and speedup are wall-clock figures of small models on a CPU, where each forward's
fixed cost is large; mean accepted length is the machine-independent number. Decoding runs on
the compiled engine (`docs/engine.md`; `--eager` for the eager one); the warm-up compiles,
outside the timings.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

import specdec
from specdec import plugins, zoo
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.data.loops import loop_count
from specdec.data.prompts import first_per_category
from specdec.decoding.generate import engine_for
from specdec.intervals import Interval, rank_labels, ranks, ratio_interval
from specdec.protocols import forget
from specdec.training.optim import progress
from specdec.types import Stats, total_stats
from specdec.zoo.costs import model_steps
from specdec.zoo.measure import Evaluation, read_evaluation

HEADER = ("drafter", "mean acc. len [95%]", "acc. rank", "from loops", "acceptance", "tokens/s", "speedup [95%]",
          "speed rank", "lossless")
CHAINS = ("ngram", "lookahead", "suffix", "retrieval", "draft-model", "draft-model-xtok", "self", "medusa", "eagle",
          "eagle3", "mtp")  # zoo labels (`specdec.zoo.options`); those the family has are shown
DRAFTERS = tuple(label for name in CHAINS for label in (name, f"{name}+tree"))  # NAME+tree: its token-tree mode
HYBRID_DRAFTERS = ("mtp", "mtp+tree")  # the hybrid family's story: its MTP module, chains and trees


@dataclass(frozen=True)
class Row:
    """One line of the table: the counters summed over prompts, and per prompt the tokens
    emitted, target forwards and (median over rounds) seconds."""

    drafter: str
    stats: Stats
    new_tokens: list[int]
    steps: list[int]
    seconds: list[float]
    loop_accepted: int  # accepted draft tokens that were loop tokens
    lossless: bool | None  # greedy tokens equal to plain greedy decoding's (None: none checked)

    @property
    def accepted_length(self) -> Interval:
        return ratio_interval(self.new_tokens, self.steps)

    @property
    def from_loops(self) -> float:
        return self.loop_accepted / self.stats.steps if self.stats.steps else 0.0


def drafter_options(directory: Path, labels: tuple[str, ...] = DRAFTERS) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each of `labels` the zoo can serve here: its registered drafter and options
    (`zoo.zoo_drafters`); NAME+tree adds the drafter's tree options, where it drafts trees."""
    known = zoo.zoo_drafters(directory)
    chosen = {}
    for label in labels:
        base, _, tree = label.partition("+")
        if base not in known:
            continue
        name, options = known[base]
        tree_options = getattr(plugins.drafter_class(name), "tree_options", None)
        if not tree:
            chosen[label] = (name, options)
        elif tree_options:
            chosen[label] = (name, {**options, **tree_options})
    return chosen


def decode_one(target: specdec.CausalLM, prompt: torch.Tensor, drafter: Any, evaluation: Evaluation, seed: int,
               compile: bool, greedy: bool = False, tokenizer: Any = None) -> specdec.Generation:
    """One prompt decoded; `tokenizer` (the target's) serves a draft model of another tokenizer and
    the self drafter's search."""
    sampling = specdec.Sampling() if greedy else evaluation.sampling
    return specdec.generate(target, prompt, drafter=drafter, num_draft_tokens=evaluation.k if drafter else 0,
                            max_new_tokens=evaluation.new_tokens, sampling=sampling, seed=seed, compile=compile,
                            verify_rule=evaluation.verify_rule, tokenizer=tokenizer)


def warm_ups(prompts: list[torch.Tensor], drafter: Any, evaluation: Evaluation) -> list[int]:
    """One prompt per static-cache size the runs meet (the target's, and a drafter's own, which
    holds its draft rows too): its graphs are compiled before the timed rounds, not in them."""
    chosen: dict[tuple[int, int], int] = {}
    k = evaluation.k if drafter is not None else 0
    for i, prompt in enumerate(prompts):
        engine = engine_for(drafter, k, prompt.shape[0] + evaluation.new_tokens, True)
        key = (engine.capacity(), engine.capacity(extra=engine.max_draft + 1 + engine.draft_nodes))
        chosen.setdefault(key, i)
    return sorted(chosen.values())


def compare(target: specdec.CausalLM, prompts: list[torch.Tensor], numbers: list[int], directory: Path,
            evaluation: Evaluation, args: argparse.Namespace, labels: tuple[str, ...] = DRAFTERS,
            tokenizer: Any = None) -> list[Row]:
    """Plain decoding and each drafter of `labels` on every prompt, prompt by prompt, `args.repeats`
    rounds (prompt i with seed evaluation.seed + numbers[i]); per-prompt median seconds. Before the rounds,
    every row decodes the first `args.check` prompts greedily to check its tokens against plain
    greedy decoding's, and one prompt per cache size the rounds meet (`warm_ups`): the graphs are
    compiled there, outside the timings. Each drafter is made
    once (its prefill resets it) and forgets what it remembered at the start of each round, so the
    counters repeat every round and equal the family's figures. A bar on stderr shows progress."""
    options = drafter_options(directory, labels)
    names: list[str | None] = [None, *(label for label in labels if label in options)]
    drafters: dict[str | None, Any] = {None: None}
    for label in names[1:]:
        registered, drafter_settings = options[label]  # type: ignore[index]
        drafters[label] = specdec.make_drafter(registered, **drafter_settings)
    compile = not args.eager
    checked = prompts[: args.check]
    warm = {name: warm_ups(prompts, drafters[name], evaluation) for name in names}
    bar = progress(sum(len(checked) + len(warm[name]) + args.repeats * len(prompts) for name in names), "decoding",
                   not args.no_progress)
    bar.unit = "run"
    greedy: dict[str | None, list[list[int]]] = {}
    for name in names:  # the lossless check, and the warm-up of the sampled runs
        bar.set_description(f"checking{' (compiling)' if compile else ''}: {name or 'plain'}")
        forget(drafters[name])
        greedy[name] = [decode_one(target, p, drafters[name], evaluation, 0, compile, True, tokenizer).tokens
                        for p in checked]
        for i in warm[name]:
            decode_one(target, prompts[i], drafters[name], evaluation, evaluation.seed + numbers[i], compile,
                       tokenizer=tokenizer)
        bar.update(len(checked) + len(warm[name]))
    runs: dict[str | None, list[specdec.Generation]] = {}
    seconds: dict[str | None, list[list[float]]] = {name: [[] for _ in prompts] for name in names}
    for round_number in range(1, args.repeats + 1):
        for name in names:
            forget(drafters[name])
            runs[name] = []
        for i, prompt in enumerate(prompts):
            bar.set_description(f"round {round_number}/{args.repeats}: prompt {i + 1}/{len(prompts)}")
            for name in names:
                result = decode_one(target, prompt, drafters[name], evaluation, evaluation.seed + numbers[i], compile,
                                    tokenizer=tokenizer)
                runs[name].append(result)
                seconds[name][i].append(result.stats.wall_seconds)
                bar.update(1)
    bar.close()
    rows = []
    for name in names:
        results = runs[name]
        loops = [loop_count(r.tokens, r.stats.accepted_per_step if name else [0] * r.stats.steps) for r in results]
        rows.append(Row(name or "plain", total_stats([r.stats for r in results]),
                        [r.stats.new_tokens for r in results], [r.stats.steps for r in results],
                        [statistics.median(s) for s in seconds[name]], sum(c.loop_accepted for c in loops),
                        greedy[name] == greedy[None] if checked else None))
    return rows


def table(rows: list[Row]) -> str:
    """The rows as an aligned text table, one header line and a rule; ranks among the drafters."""
    plain, drafted = rows[0], rows[1:]
    accepted_rank = rank_labels(ranks({r.drafter: (r.new_tokens, r.steps) for r in drafted}))
    speed_rank = rank_labels(ranks({r.drafter: (plain.seconds, r.seconds) for r in drafted}))
    cells = [HEADER]
    for r in rows:
        speedup = ratio_interval(plain.seconds, r.seconds)
        is_plain = r is plain
        cells.append((r.drafter, r.accepted_length.format(), "-" if is_plain else accepted_rank[r.drafter],
                      "-" if is_plain else f"{r.from_loops:.2f}", "-" if is_plain else f"{r.stats.acceptance_rate:.0%}",
                      f"{r.stats.new_tokens / sum(r.seconds):.0f}",
                      "1.00x" if is_plain else speedup.format(suffix="x"), "-" if is_plain else speed_rank[r.drafter],
                      "-" if r.lossless is None else "yes" if r.lossless else "NO"))
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


def losses(directory: Path, origin: str) -> str:
    """The held-out losses of the family's figures, one line."""
    record = zoo.manifest(directory)
    figures = zoo.read_figures(directory) or {"losses": {}}
    parts = [f"{name} {figures['losses'][name]['loss']:.2f}" for name in ("target", "draft-model", "draft-model-xtok",
                                                                           "medusa", "eagle", "eagle3", "mtp")
             if name in figures["losses"]]
    return f"{record['name']} zoo ({origin}: {directory}); held-out loss (nats/token): {', '.join(parts)}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the quick zoo (built here in under a minute)")
    parser.add_argument("--built", action="store_true",
                        help="the families built on this machine by `specdec zoo build` (default: the shipped ones)")
    parser.add_argument("--cache-dir", default=None, help="zoo cache directory (default: the user cache)")
    parser.add_argument("--prompts", type=int, default=None,
                        help="evaluation prompts per category (default: all of the family's, 20 for the full one)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens to generate per prompt (default: the "
                        "family's evaluation, 128)")
    parser.add_argument("--k", type=int, default=None, help="draft tokens per step (default: the family's, 4)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature, 0 for greedy (default: the family's, 0.5)")
    parser.add_argument("--repeats", type=int, default=1, help="timed rounds; each prompt's median counts (default 1)")
    parser.add_argument("--check", type=int, default=3,
                        help="prompts decoded greedily for the lossless check (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for decoding (default 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (building, decoding)")
    parser.add_argument("--eager", action="store_true", help="decode eagerly (default: the compiled engine)")
    parser.add_argument("--family", choices=("both", "main", "hybrid"), default="both",
                        help="the zoo families shown: the main one (every drafter), the hybrid one (MTP on a "
                             "Qwen3.5-layout target), or both (default)")
    args = parser.parse_args(argv)
    for field in ("prompts", "new_tokens", "k", "repeats", "threads", "check"):
        value = getattr(args, field)
        if value is not None and value < (0 if field == "check" else 1):
            parser.error(f"--{field.replace('_', '-')} must be >= {0 if field == 'check' else 1}, got {value}")
    if args.temperature is not None and args.temperature < 0:
        parser.error(f"--temperature must be >= 0, got {args.temperature}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    exact = True
    if args.family in ("both", "main"):
        exact &= show_family(zoo.QUICK if args.quick else zoo.FULL, args, DRAFTERS, example=True)
    if args.family in ("both", "hybrid"):
        settings = zoo.HYBRID_QUICK if args.quick else zoo.HYBRID
        size = settings.target
        print(f"\nThe Qwen3.5 case: a hybrid target of {size.layers} layers ({size.layers * 3 // 4} GatedDeltaNet "
              f"linear-attention, {size.layers // 4} full-attention) and one MTP module, drafting chains and trees.")
        exact &= show_family(settings, args, HYBRID_DRAFTERS, example=False)
    print(f"\nTotal {time.perf_counter() - began:.0f} s.")
    return 0 if exact else 1


def evaluation_of(directory: Path, args: argparse.Namespace) -> tuple[Evaluation, list[int]]:
    """The family's evaluation with the command line's changes, and each prompt's place in the
    family's (prompt i samples with seed evaluation.seed + i, as in the family's figures)."""
    evaluation = read_evaluation(directory)
    prompts = evaluation.prompts
    if args.prompts is not None:
        prompts = first_per_category(prompts, args.prompts)
    numbers = [evaluation.prompts.index(p) for p in prompts]
    return replace(evaluation, prompts=prompts, new_tokens=args.new_tokens or evaluation.new_tokens,
                   k=args.k or evaluation.k,
                   temperature=evaluation.temperature if args.temperature is None else args.temperature), numbers


def show_family(settings: zoo.ZooSettings, args: argparse.Namespace, labels: tuple[str, ...], example: bool) -> bool:
    """Load (the shipped bytes) or build one family, decode its prompts plainly and with each of
    `labels`, print its table and draft taxes; whether every drafter reproduced plain decoding."""
    directory = zoo.ready(settings, root=args.cache_dir, show_progress=not args.no_progress, built=args.built)
    origin = "built here" if args.built or settings.name not in zoo.shipped_names() else "shipped"
    evaluation, numbers = evaluation_of(directory, args)
    tokenizer = load_tokenizer(directory / "target")
    target = specdec.CausalLM(load_causal_lm(directory / "target"))
    ids = [torch.tensor(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in evaluation.prompts]
    print(losses(directory, origin))
    for name, reason in zoo.unavailable(directory).items():
        print(f"{name} is left out: {reason}")
    decoding = "greedy" if not evaluation.temperature else f"temperature {evaluation.temperature:g}, prompt i seeded i"
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        if example:
            first = decode_one(target, ids[0], None, evaluation, evaluation.seed + numbers[0], not args.eager).tokens
            share = loop_count(first, [0] * len(first)).share
            print(f"\nHeld-out prompt {evaluation.prompts[0].source} and the target's continuation ({decoding}; "
                  f"{share:.0%} of it in loops):")
            print(f"{evaluation.prompts[0].text}\033[2m{tokenizer.decode(first)}\033[0m" if sys.stdout.isatty()
                  else evaluation.prompts[0].text + tokenizer.decode(first), flush=True)
        rows = compare(target, ids, numbers, directory, evaluation, args, labels, tokenizer)
    finally:
        torch.set_num_threads(previous)
    categories = ", ".join(sorted({p.category for p in evaluation.prompts}))
    print(f"\n{len(ids)} held-out prompts ({categories}), {decoding}, k = {evaluation.k}, {evaluation.new_tokens} new "
          f"tokens each, {args.threads} thread(s), {'eager' if args.eager else 'compiled'}; per-prompt median of "
          f"{args.repeats} round(s); lossless: the first {min(args.check, len(ids))} prompts decoded greedily:")
    print(table(rows))
    print()
    print(draft_taxes(rows, evaluation.k))
    return all(r.lossless is not False for r in rows)


if __name__ == "__main__":
    sys.exit(main())
