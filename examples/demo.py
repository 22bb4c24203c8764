"""`make demo`: every drafter of the zoo, side by side, on held-out code prompts.

It first says how long the whole run should take, from the decodes and the rows to compile it
counts, at rates measured on 2 CPU cores (`docs/zoo.md`, *How long `make demo` takes*). Then, in
two to three minutes there, a first look: every drafter on three prompts, one per category, decoded
eagerly, so that nothing waits for a compile, and tabled by what the engine does not change (the
compiled engine emits the same tokens: these are the full table's figures for those prompts).
After it, how long the rest should take at the pace the first look measured, and the full
evaluation below, its progress on stderr. With `--eager` the full evaluation takes the first
look's decodes as its own, but for a drafter that learns across prompts (suffix: in the full
round it has seen other prompts first).

The zoo ships with specdec (`specdec.zoo.shipped`): a tokenizer, a 32-layer Qwen3-architecture
target with an MTP module, a draft model, a draft model on a tokenizer of its own (draft-model-xtok:
drafting across vocabularies), Medusa heads, an EAGLE-1 and an EAGLE-3 head, a DFlash block drafter
and a PARD draft model (parallel drafters: a whole draft from one forward), all trained by specdec
on the standard library's source, and a retrieval datastore of that text, rebuilt from its recipe on
first use. Every machine decodes with the same bytes, so the accepted lengths below are the ones
`docs/zoo.md` publishes. Every drafter, the training-free ones (ngram, lookahead, suffix, retrieval,
and self: the target drafting with some of its own layers) and the learned ones, decodes the
family's evaluation prompts (held-out function signatures, class headers and half-written functions)
at the family's temperature with a fixed seed per prompt, k draft tokens per step, interleaved
prompt by prompt with plain decoding of the same target, once drafting chains and once drafting
token trees (NAME+tree, `docs/trees.md`; the drafters that draft trees; dflash+tree is DDTree).
DFlash drafts its whole block, k = 15, and eagle3-k15 is the EAGLE-3 head at that same k. Sampled, because the zoo's
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
decodes the same way plainly, with its MTP module and with a DFlash drafter trained for it
(the seed's question: which drafter a Qwen3.5 model should use), chains and trees, compiled: the
linear layers keep each draft row's state and the commit takes the accepted one
(`docs/engine.md`), with its draft tax below.

Tokens/s and speedup are wall-clock figures of small models on a CPU, where each forward's
fixed cost is large; mean accepted length is the machine-independent number. Decoding runs on
the compiled engine (`docs/engine.md`; `--eager` for the eager one); each row's warm-up, outside
the timings, compiles its graphs (eagerly: pays a drafter's first-use setup, such as self's search
of the layers it keeps).
"""

from __future__ import annotations

import argparse
import itertools
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
from specdec.data.prompts import Prompt, first_per_category
from specdec.decoding.generate import engine_for
from specdec.intervals import Interval, rank_labels, ranks, ratio_interval
from specdec.protocols import forget
from specdec.training.optim import progress
from specdec.types import Stats, total_stats
from specdec.zoo.costs import model_steps
from specdec.zoo.measure import Evaluation, read_evaluation

HEADER = ("drafter", "mean acc. len [95%]", "acc. rank", "from loops", "acceptance", "tokens/s", "speedup [95%]",
          "speed rank", "lossless")
FIRST_LOOK_HEADER = HEADER[:5]  # what a first look shows: the same for the eager and the compiled engine
CHAINS = ("ngram", "lookahead", "suffix", "retrieval", "draft-model", "draft-model-xtok", "self", "medusa", "eagle",
          "eagle3", "mtp", "dflash", "pard")  # zoo labels (`specdec.zoo.options`); those the family has are shown
# NAME+tree: its token-tree mode (dflash+tree: DDTree); then EAGLE-3 at DFlash's k, a chain
DRAFTERS = (*(label for name in CHAINS for label in (name, f"{name}+tree")), "eagle3-k15")
# the hybrid family's story, the seed's question: its own MTP module or a DFlash drafter, chains and trees
HYBRID_DRAFTERS = ("mtp", "mtp+tree", "dflash", "dflash+tree")
FIRST_LOOK = 3  # prompts of the first look (--first-look): the categories' first prompts in turn
# The rates the start's estimate counts with, measured on 2 CPU cores (docs/zoo.md, *How long
# `make demo` takes*): seconds a token decoded eagerly and compiled (one thread, the shipped rows on
# average) and seconds a row's compile takes (its graphs, check and warm-ups; the hybrid's cost more).
EAGER_TOKEN_SECONDS = 0.012
COMPILED_TOKEN_SECONDS = 0.0035
COMPILE_ROW_SECONDS = 35.0


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


@dataclass(frozen=True)
class Family:
    """One zoo family as this run decodes it: its evaluation as the command line changes it (prompt
    i samples with seed evaluation.seed + numbers[i]), its rows (None: plain decoding), each made
    once (its prefill resets it), and the prompts of its first look (none: it has none)."""

    settings: zoo.ZooSettings
    directory: Path
    origin: str
    evaluation: Evaluation
    numbers: list[int]
    drafters: dict[str | None, Any]
    first_look: list[int]
    example: bool  # whether it shows the target's continuation of a held-out prompt (the main family)


@dataclass(frozen=True)
class Work:
    """Decodes of `tokens` new tokens each, eager and compiled, and rows whose graphs compile."""

    eager: int
    compiled: int
    compiled_rows: int
    tokens: int

    @property
    def seconds(self) -> float:
        """What it takes at the rates measured on 2 CPU cores (EAGER_TOKEN_SECONDS and the rest)."""
        return (self.tokens * (self.eager * EAGER_TOKEN_SECONDS + self.compiled * COMPILED_TOKEN_SECONDS)
                + self.compiled_rows * COMPILE_ROW_SECONDS)


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


def learns(drafter: Any) -> bool:
    """Whether the drafter remembers earlier generations (it has `forget`, `specdec.protocols.forget`):
    its decode of a prompt depends on the prompts decoded before it in the round."""
    return callable(getattr(drafter, "forget", None))


def first_look_prompts(prompts: tuple[Prompt, ...], count: int) -> list[int]:
    """The indices of `count` prompts, the categories' first prompts in turn (each category's first,
    then each one's second, ...), in the evaluation's order."""
    by_category: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        by_category.setdefault(prompt.category, []).append(i)
    turns = [i for group in itertools.zip_longest(*by_category.values()) for i in group if i is not None]
    return sorted(turns[:count])


def row_evaluation(name: str | None, evaluation: Evaluation) -> Evaluation:
    """The evaluation as row `name` decodes it: at its own k where the zoo gives it one (DFlash
    drafts its whole block, `specdec.zoo.draft_length`), else at the evaluation's."""
    if name is None:
        return evaluation
    return replace(evaluation, k=zoo.draft_length(name.removesuffix("+tree"), evaluation.k))


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


def warm_up(target: specdec.CausalLM, prompt: torch.Tensor, drafter: Any, evaluation: Evaluation, seed: int,
            compile: bool, tokenizer: Any) -> None:
    """One decode outside the timings, so that a row's timed decodes do not pay its one-time costs:
    compiled, a whole one (its graphs compile); eagerly, k + 1 tokens (a drafter's first-use setup)."""
    budget = evaluation if compile else replace(evaluation, new_tokens=evaluation.k + 1)
    decode_one(target, prompt, drafter, budget, seed, compile, tokenizer=tokenizer)


def decode_round(target: specdec.CausalLM, prompts: list[torch.Tensor], numbers: list[int], indices: list[int],
                 drafters: dict[str | None, Any], evaluation: Evaluation, compile: bool, tokenizer: Any, bar: Any,
                 label: str, done: dict[str | None, dict[int, specdec.Generation]] | None = None
                 ) -> dict[str | None, dict[int, specdec.Generation]]:
    """One round, each drafter forgetting first: the prompts of `indices` in turn, each decoded by
    every row before the next (a drift in the machine's speed falls on every row alike); the
    decodes in `done` (row -> prompt index -> decode) are taken as they are."""
    runs = {name: dict((done or {}).get(name, {})) for name in drafters}
    for drafter in drafters.values():
        forget(drafter)
    for n, i in enumerate(indices, 1):
        bar.set_description(f"{label}: prompt {n}/{len(indices)}")
        for name, drafter in drafters.items():
            if i not in runs[name]:
                runs[name][i] = decode_one(target, prompts[i], drafter, row_evaluation(name, evaluation),
                                           evaluation.seed + numbers[i], compile, tokenizer=tokenizer)
            bar.update(1)
    return runs


def row_of(name: str | None, runs: list[specdec.Generation], seconds: list[float], lossless: bool | None) -> Row:
    """A row of the table from its decodes (one per prompt) and each prompt's seconds."""
    loops = [loop_count(r.tokens, r.stats.accepted_per_step if name else [0] * r.stats.steps) for r in runs]
    return Row(name or "plain", total_stats([r.stats for r in runs]), [r.stats.new_tokens for r in runs],
               [r.stats.steps for r in runs], seconds, sum(c.loop_accepted for c in loops), lossless)


def compare(target: specdec.CausalLM, prompts: list[torch.Tensor], family: Family, args: argparse.Namespace,
            tokenizer: Any = None, earlier: dict[str | None, dict[int, specdec.Generation]] | None = None
            ) -> list[Row]:
    """Plain decoding and each drafter of the family on every prompt, `args.repeats` rounds
    (`decode_round`; the first takes `earlier`'s decodes as its own); per-prompt median seconds.
    Before the rounds, every row decodes the first `args.check` prompts greedily to check its
    tokens against plain greedy decoding's, and warms up on one prompt per cache size the rounds
    meet (`warm_ups`, `warm_up`): the graphs are compiled there, outside the timings. Each drafter
    forgets what it remembered at the start of each round, so the counters repeat every round and
    equal the family's figures. A bar on stderr shows progress."""
    evaluation, numbers, drafters = family.evaluation, family.numbers, family.drafters
    compile = not args.eager
    checked = prompts[: args.check]
    warm = {name: warm_ups(prompts, drafter, row_evaluation(name, evaluation)) if compile else [0]
            for name, drafter in drafters.items()}
    bar = progress(sum(len(checked) + len(warm[name]) + args.repeats * len(prompts) for name in drafters),
                   "decoding", not args.no_progress)
    bar.unit = "run"
    greedy: dict[str | None, list[list[int]]] = {}
    for name, drafter in drafters.items():  # the lossless check, and the warm-up of the sampled runs
        bar.set_description(f"checking{' (compiling)' if compile else ''}: {name or 'plain'}")
        forget(drafter)
        own = row_evaluation(name, evaluation)
        greedy[name] = [decode_one(target, p, drafter, own, 0, compile, True, tokenizer).tokens for p in checked]
        for i in warm[name]:
            warm_up(target, prompts[i], drafter, own, evaluation.seed + numbers[i], compile, tokenizer)
        bar.update(len(checked) + len(warm[name]))
    indices = list(range(len(prompts)))
    seconds: dict[str | None, list[list[float]]] = {name: [[] for _ in prompts] for name in drafters}
    for round_number in range(1, args.repeats + 1):
        runs = decode_round(target, prompts, numbers, indices, drafters, evaluation, compile, tokenizer, bar,
                            f"round {round_number}/{args.repeats}", earlier if round_number == 1 else None)
        for name in drafters:
            for i in indices:
                seconds[name][i].append(runs[name][i].stats.wall_seconds)
    bar.close()
    return [row_of(name, [runs[name][i] for i in indices], [statistics.median(s) for s in seconds[name]],
                   greedy[name] == greedy[None] if checked else None) for name in drafters]


def table(rows: list[Row], timed: bool = True) -> str:
    """The rows as an aligned text table, one header line and a rule; ranks among the drafters. Not
    `timed`: the columns that do not depend on the engine or the machine only (FIRST_LOOK_HEADER)."""
    plain, drafted = rows[0], rows[1:]
    accepted_rank = rank_labels(ranks({r.drafter: (r.new_tokens, r.steps) for r in drafted}))
    speed_rank = rank_labels(ranks({r.drafter: (plain.seconds, r.seconds) for r in drafted}))
    header = HEADER if timed else FIRST_LOOK_HEADER
    cells = [header]
    for r in rows:
        speedup = ratio_interval(plain.seconds, r.seconds)
        is_plain = r is plain
        cells.append((r.drafter, r.accepted_length.format(), "-" if is_plain else accepted_rank[r.drafter],
                      "-" if is_plain else f"{r.from_loops:.2f}", "-" if is_plain else f"{r.stats.acceptance_rate:.0%}",
                      f"{r.stats.new_tokens / sum(r.seconds):.0f}",
                      "1.00x" if is_plain else speedup.format(suffix="x"), "-" if is_plain else speed_rank[r.drafter],
                      "-" if r.lossless is None else "yes" if r.lossless else "NO")[: len(header)])
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
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
    parser.add_argument("--first-look", type=int, default=FIRST_LOOK,
                        help="prompts of the first look, the categories' first in turn, decoded eagerly before "
                             f"the full evaluation (default {FIRST_LOOK}; 0: none)")
    parser.add_argument("--check", type=int, default=3,
                        help="prompts decoded greedily for the lossless check (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for decoding (default 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (building, decoding)")
    parser.add_argument("--eager", action="store_true", help="decode eagerly (default: the compiled engine)")
    parser.add_argument("--family", choices=("both", "main", "hybrid"), default="both",
                        help="the zoo families shown: the main one (every drafter), the hybrid one (MTP on a "
                             "Qwen3.5-layout target), or both (default)")
    args = parser.parse_args(argv)
    for field in ("prompts", "new_tokens", "k", "repeats", "threads", "check", "first_look"):
        value, least = getattr(args, field), 0 if field in ("check", "first_look") else 1
        if value is not None and value < least:
            parser.error(f"--{field.replace('_', '-')} must be >= {least}, got {value}")
    if args.temperature is not None and args.temperature < 0:
        parser.error(f"--temperature must be >= 0, got {args.temperature}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    shown = [(zoo.QUICK if args.quick else zoo.FULL, DRAFTERS)] if args.family in ("both", "main") else []
    if args.family in ("both", "hybrid"):
        shown.append((zoo.HYBRID_QUICK if args.quick else zoo.HYBRID, HYBRID_DRAFTERS))
    families = [open_family(settings, labels, args, args.first_look if n == 0 else 0, example=labels is DRAFTERS)
                for n, (settings, labels) in enumerate(shown)]
    plans = [planned(family, args) for family in families]
    print(announce(plans, len(families[0].first_look)))
    rest = sum(plan[1].seconds for plan in plans)  # all but the first look, at the measured rates
    exact = True
    for family, (settings, labels) in zip(families, shown):
        if labels is HYBRID_DRAFTERS:
            size = settings.target
            print(f"\nThe Qwen3.5 case: a hybrid target of {size.layers} layers ({size.layers * 3 // 4} "
                  f"GatedDeltaNet linear-attention, {size.layers // 4} full-attention): its own MTP module against a "
                  "DFlash drafter trained for it, drafting chains and trees.")
        exact &= show_family(family, args, rest)
    estimate = sum(look.seconds + full.seconds for look, full in plans)
    print(f"\nTotal {time.perf_counter() - began:.0f} s (estimated at the start: {estimate:.0f} s).")
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


def open_family(settings: zoo.ZooSettings, labels: tuple[str, ...], args: argparse.Namespace, first_look: int,
                example: bool) -> Family:
    """Load (the shipped bytes) or build one family and make its rows; a first look of `first_look`
    prompts, unless the full evaluation is eager and no longer (it would print the same table)."""
    directory = zoo.ready(settings, root=args.cache_dir, show_progress=not args.no_progress, built=args.built)
    origin = "built here" if args.built or settings.name not in zoo.shipped_names() else "shipped"
    evaluation, numbers = evaluation_of(directory, args)
    drafters: dict[str | None, Any] = {None: None}
    for label, (registered, options) in drafter_options(directory, labels).items():
        drafters[label] = specdec.make_drafter(registered, **options)
    look = first_look_prompts(evaluation.prompts, first_look)
    if args.eager and len(look) == len(evaluation.prompts):
        look = []
    return Family(settings, directory, origin, evaluation, numbers, drafters, look, example)


def planned(family: Family, args: argparse.Namespace) -> tuple[Work, Work]:
    """The family's first look and the rest of its run: the decodes of the first look, the greedy
    check and the timed rounds (less those the rounds take from the first look; and the example's,
    when no first look decodes it), and the rows whose graphs compile; warm-ups aside."""
    rows, look, prompts = len(family.drafters), len(family.first_look), len(family.evaluation.prompts)
    reused = look * sum(not learns(drafter) for drafter in family.drafters.values()) if args.eager else 0
    rest = rows * (min(args.check, prompts) + args.repeats * prompts) - reused + int(family.example and not look)
    tokens = family.evaluation.new_tokens
    first = Work(rows * look, 0, 0, tokens)
    return first, Work(rest, 0, 0, tokens) if args.eager else Work(0, rest, rows, tokens)


def announce(plans: list[tuple[Work, Work]], looked: int) -> str:
    """The start's line: what the whole run does and how long it should take, and its first look."""
    works = [work for plan in plans for work in plan]
    decodes, rows = sum(w.eager + w.compiled for w in works), sum(w.compiled_rows for w in works)
    line = (f"The whole run: {decodes:,} decodes of up to {max(w.tokens for w in works)} new tokens"
            f"{f' and {rows} rows to compile' if rows else ''}, about {minutes(sum(w.seconds for w in works))} "
            f"on 2 CPU cores with nothing else running (at the rates measured there, docs/zoo.md: "
            f"{EAGER_TOKEN_SECONDS * 1e3:.0f} ms a token eager, {COMPILED_TOKEN_SECONDS * 1e3:.1f} ms compiled, "
            f"{COMPILE_ROW_SECONDS:.0f} s to compile a row); longer beside other work.")
    if looked:
        line += (f"\nFirst, a look at every drafter on {looked} prompt{'s' if looked > 1 else ''}, decoded eagerly: "
                 f"about {minutes(plans[0][0].seconds)}.")
    return line


def minutes(seconds: float) -> str:
    count = max(1, round(seconds / 60))
    return f"{count} minute{'s' if count > 1 else ''}"


def show_example(prompt: Prompt, tokens: list[int], tokenizer: Any, decoding: str) -> None:
    """The held-out prompt and the target's continuation, dimmed on a terminal."""
    share = loop_count(tokens, [0] * len(tokens)).share
    print(f"\nHeld-out prompt {prompt.source} and the target's continuation ({decoding}; {share:.0%} of it in loops):")
    continuation = tokenizer.decode(tokens)
    print(f"{prompt.text}\033[2m{continuation}\033[0m" if sys.stdout.isatty() else prompt.text + continuation,
          flush=True)


def look_first(target: specdec.CausalLM, prompts: list[torch.Tensor], family: Family, args: argparse.Namespace,
               tokenizer: Any, decoding: str) -> dict[str | None, dict[int, specdec.Generation]]:
    """Every row on the family's first-look prompts, eagerly (nothing to compile), the example shown
    from plain decoding's first, and their table; returns the decodes the full evaluation takes as
    its own: where it decodes eagerly too, those of the rows that do not learn (`learns`)."""
    evaluation, indices, drafters = family.evaluation, family.first_look, family.drafters
    first, seed = indices[0], evaluation.seed + family.numbers[indices[0]]
    done: dict[str | None, dict[int, specdec.Generation]] = {}
    if family.example:  # the first prompt's plain decode, shown before the rest
        warm_up(target, prompts[first], None, evaluation, seed, False, tokenizer)
        done[None] = {first: decode_one(target, prompts[first], None, evaluation, seed, False, tokenizer=tokenizer)}
        show_example(evaluation.prompts[first], done[None][first].tokens, tokenizer, decoding)
    bar = progress(len(drafters) * (1 + len(indices)), "first look: warming up", not args.no_progress)
    bar.unit = "run"
    for name, drafter in drafters.items():
        warm_up(target, prompts[first], drafter, row_evaluation(name, evaluation), seed, False, tokenizer)
        bar.update(1)
    runs = decode_round(target, prompts, family.numbers, indices, drafters, evaluation, False, tokenizer, bar,
                        "first look", done)
    bar.close()
    rows = [row_of(name, [runs[name][i] for i in indices], [runs[name][i].stats.wall_seconds for i in indices], None)
            for name in drafters]
    categories = ", ".join(sorted({evaluation.prompts[i].category for i in indices}))
    print(f"\nFirst look: every drafter on {len(indices)} of the {len(prompts)} held-out prompts ({categories}), "
          f"{decoding}, k = {evaluation.k}, {evaluation.new_tokens} new tokens each, decoded eagerly (nothing to "
          f"compile); what the engine does not change, the full evaluation below adds the timings:")
    print(table(rows, timed=False), flush=True)
    return {name: runs[name] for name, drafter in drafters.items() if args.eager and not learns(drafter)}


def show_family(family: Family, args: argparse.Namespace, rest: float) -> bool:
    """Decode one family's prompts plainly and with each of its drafters (after its first look, if
    it has one: then how long `rest`, the run's seconds after it at the measured rates, should
    take at the pace the first look measured), print its table and draft taxes; whether every
    drafter reproduced plain decoding."""
    evaluation = family.evaluation
    tokenizer = load_tokenizer(family.directory / "target")
    target = specdec.CausalLM(load_causal_lm(family.directory / "target"))
    ids = [torch.tensor(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in evaluation.prompts]
    print(losses(family.directory, family.origin))
    for name, reason in zoo.unavailable(family.directory).items():
        print(f"{name} is left out: {reason}")
    decoding = "greedy" if not evaluation.temperature else f"temperature {evaluation.temperature:g}, prompt i seeded i"
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        earlier: dict[str | None, dict[int, specdec.Generation]] = {}
        if family.first_look:
            began = time.perf_counter()
            earlier = look_first(target, ids, family, args, tokenizer, decoding)
            took, expected = time.perf_counter() - began, planned(family, args)[0].seconds
            print(f"\nThe first look took {took:.0f} s ({took / expected:.1f}x the {expected:.0f} s the rates above "
                  f"give): at that pace the rest takes about {minutes(rest * took / expected)}.")
        elif family.example:
            first = decode_one(target, ids[0], None, evaluation, evaluation.seed + family.numbers[0], not args.eager)
            show_example(evaluation.prompts[0], first.tokens, tokenizer, decoding)
        print(f"\nThe full evaluation: every drafter on all {len(ids)} prompts, "
              f"{'eagerly' if args.eager else 'compiled (each row compiles first, in its check and warm-up)'}.",
              flush=True)
        rows = compare(target, ids, family, args, tokenizer, earlier)
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
