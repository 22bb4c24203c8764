"""`specdec bench`: drafters, and transformers' own decoding, side by side on one target.

    specdec bench                                   # the zoo, every drafter, held-out code prompts
    specdec bench --target DIR --drafter ngram --drafter draft-model:model=SMALL --k 2 4 8
    specdec bench --prompts question.jsonl --k auto --temperature 0.7 --out results/
    specdec bench --target org/name --prompts question.jsonl --prompt-format raw   # no chat template
    specdec bench --engine both                     # every specdec row eager and compiled (default: compiled)
    specdec bench --noise-bound 0.05 --max-repeats 12   # stricter about a busy machine's timings
    specdec bench --batch 1 2 4 8 16 32             # tokens/s against batch size: where speculation stops paying
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specdec.cli.common import CLIError, add_model_options, load_target
from specdec.distributed.sharding import is_main_process, rank_zero_first
from specdec.errors import one_line

__all__ = ["add_bench_command", "parse_k"]


def parse_k(text: str) -> int | str:
    """A `--k` value: a positive int or "auto"."""
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes positive ints or 'auto', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--k takes positive ints or 'auto', got {value}")
    return value


def _llama_cpp_file(file: Path | None) -> Path | None:
    """`--llama-cpp FILE`, checked before anything loads: the file exists and the bindings are there."""
    from specdec.bench.llama_cpp import LLAMA_CPP_INSTALL, llama_cpp_available

    if file is None:
        return None
    if not file.is_file():
        raise CLIError(f"--llama-cpp {file}: no such file; give a GGUF file of the target's weights")
    if not llama_cpp_available():
        raise CLIError(f"--llama-cpp needs llama.cpp's Python bindings: {LLAMA_CPP_INSTALL}")
    return file


def _check_counts(args: argparse.Namespace) -> None:
    for flag in ("max_new_tokens", "repeats"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")


def _zoo_dir(args: argparse.Namespace) -> Path | None:
    """The zoo family benchmarked when no --target is given (built on first use), else None."""
    if args.target is not None:
        return None
    from specdec import zoo

    with rank_zero_first():  # under torchrun, one rank builds it
        return zoo.ready(zoo.QUICK if args.quick else zoo.FULL, root=args.cache_dir, show_progress=not args.no_progress)


def _sampling(args: argparse.Namespace, zoo_dir: Path | None) -> Any:
    """The sampling settings, and `args.verify_rule` settled: on its own prompts the zoo decodes at
    its family's temperature (greedily it loops) and under the rule of its figures, unless told
    otherwise."""
    from specdec.cli.sampling_options import rules_for, sampling_from

    on_zoo = zoo_dir is not None and args.prompts is None and not args.batch
    evaluation = None
    if on_zoo and (args.temperature is None or args.verify_rule is None):
        from specdec.zoo.measure import read_evaluation

        evaluation = read_evaluation(zoo_dir)  # type: ignore[arg-type]
    temperature = args.temperature
    if temperature is None:
        temperature = evaluation.temperature if evaluation is not None else 0.0
    args.verify_rule = list(rules_for(args.verify_rule, evaluation.verify_rule if evaluation is not None else None))
    return sampling_from(args, temperature)


def _drafters(args: argparse.Namespace, zoo_dir: Path | None) -> list[tuple[str, dict[str, Any]]]:
    """The --drafter specs (a zoo drafter finding its files), or every drafter that serves the target."""
    from specdec.bench.session import default_drafters
    from specdec.cli.common import parse_drafter_spec

    if not args.drafter:
        drafters, skipped = default_drafters(zoo_dir)
        for line in skipped:
            print(f"specdec: skipping drafter {line}", file=sys.stderr)
        return drafters
    from specdec.zoo import drafter_options

    known = drafter_options(zoo_dir) if zoo_dir is not None else {}
    drafters = [(name, {**known.get(name, {}), **options})
                for name, options in (parse_drafter_spec(spec) for spec in args.drafter)]
    for _, options in drafters:
        if "k" in options and options["k"] != "auto" and (not isinstance(options["k"], int) or options["k"] < 1):
            raise ValueError(f"drafter option k must be a positive int or auto, got {options['k']!r}")
    return drafters


def _run(config: Any, args: argparse.Namespace, model: Any, tokenizer: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`run_session` under a progress bar."""
    from specdec.bench.session import run_session
    from specdec.training.optim import progress

    bars: list[Any] = []

    def advance_factory(total: int) -> Any:
        bars.append(progress(total, "bench", not args.no_progress))
        return lambda: bars[0].update(1)

    try:
        return run_session(config, Path(args.out), model, tokenizer, advance_factory)
    finally:
        for bar in bars:
            bar.close()


def _report(args: argparse.Namespace, config: Any, target: Path, records: list[dict[str, Any]],
            document: dict[str, Any]) -> int:
    """Print the settings, the tables and the files written; 1 when a row did not reproduce plain
    greedy decoding."""
    from specdec.bench.plots import write_plots
    from specdec.bench.report import table
    from specdec.cli.sampling_options import describe

    out, sampling = Path(args.out), config.sampling
    try:
        plots = write_plots(records, out / "plots") if is_main_process() else []
    except ImportError:
        plots = []
        print("specdec: matplotlib is not installed; no plots (pip install matplotlib)", file=sys.stderr)
    settings = document["settings"]
    print(f"{settings['questions']} questions ({settings['turns']} turns, {settings['prompt_format']} prompts), "
          f"{config.max_new_tokens} new tokens, "
          f"{describe(sampling)}{'' if sampling.greedy else ', question i seeded i'}, "
          f"rule{'s' if len(config.verify_rules) > 1 else ''} {', '.join(config.verify_rules)} (docs/verification.md), "
          f"median±spread (IQR / median) over {config.repeats} rounds, up to {config.repeat_limit} for a row spreading "
          f"more than {config.noise_bound:.0%} ({document['rounds']} rounds run); [95%]: bootstrap interval over "
          f"prompts, rank: by it among the drafters (= where the intervals cannot order them); from loops: the part of "
          f"the accepted length that was loop tokens; target {target}")
    if settings["peers_left_out_for"]:
        print(f"transformers' generate left out: it cannot apply {', '.join(settings['peers_left_out_for'])}")
    if settings["llama_cpp_left_out_for"]:
        print(f"llama.cpp left out: its sampler cannot apply {', '.join(settings['llama_cpp_left_out_for'])}")
    categories = sorted({r["category"] for r in records} - {"all"})
    print(table(records))
    if len(categories) > 1:
        for category in categories:
            print(f"\n{category}:")
            print(table(records, category))
    print(f"\nwrote {out / 'results.json'}, {out / 'results.csv'}" + "".join(f", {p}" for p in plots))
    same = [r for r in records if r["same_as_plain"] is False and r["peer"] is None]
    if same:
        print(f"specdec: error: {', '.join(r['contender'] for r in same)} did not reproduce plain greedy decoding",
              file=sys.stderr)
        return 1
    return 0


def _bench(args: argparse.Namespace) -> int:
    """`specdec bench`: the settings and drafters read and checked, the target loaded, the session
    run, its report printed (`--batch`: the batch curve instead)."""
    from specdec.bench.session import ENGINES, BenchConfig

    try:
        _check_counts(args)
        zoo_dir = _zoo_dir(args)
        target = Path(args.target) if args.target else zoo_dir / "target"  # type: ignore[operator]
        sampling = _sampling(args, zoo_dir)
        drafters = _drafters(args, zoo_dir)
        engine = "compiled" if args.compile else args.engine
        if args.batch:
            return _batch_curve(args, target, drafters, sampling, engine)
        config = BenchConfig(target=target, drafters=tuple(drafters), ks=tuple(args.k), sampling=sampling,
                             max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                             max_repeats=args.max_repeats, noise_bound=args.noise_bound, warmup=args.warmup,
                             seed=args.seed, peers=not args.no_peers,
                             prompts=Path(args.prompts) if args.prompts else None,
                             prompts_per_category=args.prompts_per_category, zoo=zoo_dir,
                             engines=ENGINES if engine == "both" else (engine,), prompt_format=args.prompt_format,
                             verify_rules=tuple(args.verify_rule), llama_cpp=_llama_cpp_file(args.llama_cpp))
        tokenizer, model = load_target(target, args)
        records, document = _run(config, args, model, tokenizer)
    except (ValueError, KeyError, OSError, TypeError) as error:
        raise CLIError(one_line(error)) from None
    return _report(args, config, target, records, document)


def _batch_curve(args: argparse.Namespace, target: Path, drafters: list[tuple[str, dict[str, Any]]],
                 sampling: Any, engine: str) -> int:
    """`specdec bench --batch B...`: every contender at every batch size (`specdec.bench.batch_curve`)."""
    import json
    from dataclasses import asdict

    from specdec.bench.batch_curve import BATCH_SCHEMA, BatchCurveConfig, curve_table, run_curve, stops_paying
    from specdec.bench.peers import hf_missing
    from specdec.bench.plots import write_batch_plot
    from specdec.cli.sampling_options import describe
    from specdec.bench.questions import from_prompts, load_questions
    from specdec.bench.session import BenchConfig, contenders_for, machine_info, turn_encoder, used_prompt_format
    from specdec.data.corpus import stdlib_corpus
    from specdec.data.prompts import code_prompts
    from specdec.training.optim import progress
    from specdec.versions import software_versions

    if args.llama_cpp is not None:
        raise ValueError("--llama-cpp is a row of the batch-1 bench: leave it out of --batch")
    if engine == "both":
        raise ValueError("--batch runs one engine: give --engine eager or --engine compiled")
    if len(args.k) != 1:
        raise ValueError(f"--batch runs one draft length: give one --k (an int or auto), got {' '.join(map(str, args.k))}")
    contenders = tuple(c for c in contenders_for(drafters, args.k, False, (engine,), tuple(args.verify_rule))
                       if c.peer is None)
    config = BatchCurveConfig(batches=tuple(args.batch), contenders=contenders, sampling=sampling,
                              max_new_tokens=args.max_new_tokens, repeats=args.repeats, warmup=args.warmup,
                              seed=args.seed, peers=not args.no_peers, noise_bound=args.noise_bound)
    tokenizer, model = load_target(target, args)
    settings = BenchConfig(target=target, drafters=(), prompts=Path(args.prompts) if args.prompts else None,
                           prompt_format=args.prompt_format)
    used = used_prompt_format(settings, tokenizer)
    questions = load_questions(args.prompts) if args.prompts else from_prompts(code_prompts(stdlib_corpus()))
    encode = turn_encoder(tokenizer, used)
    prompts = [encode(q.turns, [], 0) for q in questions]
    rounds = (config.warmup + config.repeats) * len(config.batches) * (len(contenders) + int(config.peers))
    bar = progress(rounds, "bench --batch", not args.no_progress)
    try:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        records = run_curve(model, prompts, config, lambda: bar.update(1), pad_id=int(pad), tokenizer=tokenizer)
    finally:
        bar.close()
    out = Path(args.out)
    document = {"schema": BATCH_SCHEMA, "machine": machine_info(model.device), "versions": software_versions(),
                "settings": {"target": str(target), "batches": list(config.batches), "k": args.k[0],
                             "engine": engine, "max_new_tokens": config.max_new_tokens, "repeats": config.repeats,
                             "warmup": config.warmup, "seed": config.seed, "noise_bound": config.noise_bound,
                             "sampling": asdict(sampling),
                             "peers_left_out_for": hf_missing(sampling, batch=True) if config.peers else [],
                             "prompts": None if args.prompts is None else str(args.prompts),
                             "distinct_prompts": len(prompts), "prompt_format": used},
                "stops_paying": stops_paying(records), "records": records}
    written = [out / "batch.json"]
    try:
        if is_main_process():  # under torchrun, rank 0 writes the results
            out.mkdir(parents=True, exist_ok=True)
            (out / "batch.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
            written.append(write_batch_plot(records, out / "plots"))
    except ImportError:
        print("specdec: matplotlib is not installed; no plot (pip install matplotlib)", file=sys.stderr)
    print(f"{len(prompts)} distinct prompts, {config.max_new_tokens} new tokens per row, "
          f"{describe(sampling)}, k = {args.k[0]}, {engine}, "
          f"median over {config.repeats} rounds; speedup over plain decoding at the same batch size; "
          f"~ marks a cell spreading more than {config.noise_bound:.0%}")
    print(curve_table(records))
    print("\nwrote " + ", ".join(str(path) for path in written))
    wrong = sorted({r["contender"] for r in records if r["same_as_plain"] is False and r["peer"] is None})
    if wrong:
        print(f"specdec: error: {', '.join(wrong)} did not reproduce plain greedy decoding", file=sys.stderr)
        return 1
    return 0


def add_bench_command(commands: Any) -> None:
    """Register `bench` under the top-level subparsers."""
    from specdec.bench.report import NOISE_BOUND
    from specdec.cli.sampling_options import add_penalty_options, add_verify_rule_option
    from specdec.data.chat import PROMPT_FORMATS

    bench = commands.add_parser("bench", help="compare drafters and transformers' decoding on one target")
    bench.add_argument("--target", metavar="DIR|ORG/NAME", default=None,
                       help="model + tokenizer: a directory or a hub id (default: the zoo)")
    bench.add_argument("--quick", action="store_true", help="without --target: the quick zoo")
    bench.add_argument("--cache-dir", metavar="DIR", default=None, help="zoo cache directory")
    bench.add_argument("--drafter", action="append", metavar="NAME[:key=value,...]",
                       help="repeatable; k=N or k=auto sets that drafter's draft length (default: every drafter "
                            "that serves the target)")
    bench.add_argument("--prompts", metavar="FILE", help="Spec-Bench question.jsonl (default: held-out code prompts)")
    bench.add_argument("--prompt-format", choices=PROMPT_FORMATS, default="auto",
                       help="chat-template: turns as user messages, earlier answers as assistant messages, through "
                            "the tokenizer's chat template; raw: plain text; auto (default): the template for "
                            "--prompts when the tokenizer has one, else raw")
    bench.add_argument("--k", type=parse_k, nargs="+", default=[4], metavar="K", help="draft lengths or auto "
                       "(default 4)")
    bench.add_argument("--temperature", type=float, default=None,
                       help="0 = greedy; default: on the zoo's own prompts its family's evaluation temperature (0.5, "
                            "since the zoo's small target decoded greedily falls into loops), else greedy")
    bench.add_argument("--prompts-per-category", type=int, default=4, metavar="N",
                       help="without --prompts: the first N held-out code prompts of each category (default 4; the "
                            "zoo's evaluation holds 20)")
    bench.add_argument("--top-k", type=int, default=0)
    bench.add_argument("--top-p", type=float, default=1.0)
    add_penalty_options(bench)
    add_verify_rule_option(bench, several=True, on_zoo=True)
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=3, help="recorded rounds (default 3)")
    bench.add_argument("--max-repeats", type=int, default=None, metavar="N",
                       help="the most recorded rounds: rows whose timings still spread more than --noise-bound "
                            "after --repeats rounds get more, up to N, then are flagged noisy (default 3 x --repeats)")
    bench.add_argument("--noise-bound", type=float, default=NOISE_BOUND, metavar="SPREAD",
                       help="a row is noisy when its tokens/s, speedup or vs eager spreads more than this: the "
                            f"interquartile range over the rounds / the median (default {NOISE_BOUND})")
    bench.add_argument("--warmup", type=int, default=1, help="unrecorded rounds first (default 1)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--no-peers", action="store_true", help="leave out transformers' generate")
    bench.add_argument("--llama-cpp", type=Path, default=None, metavar="FILE.gguf",
                       help="a row of llama.cpp's plain decoding of this GGUF file (the target's weights, e.g. its "
                            "float32 or Q8_0 file; needs `pip install llama-cpp-python`)")
    bench.add_argument("--out", default="bench-results", metavar="DIR", help="default ./bench-results")
    bench.add_argument("--no-progress", action="store_true")
    bench.add_argument("--batch", type=int, nargs="+", default=None, metavar="B",
                       help="batch sizes: tokens/s of plain decoding and each drafter with B prompts decoded "
                            "together (specdec.generate_batch), the speedup at each B and where it stops paying")
    bench.add_argument("--engine", choices=("eager", "compiled", "both"), default="compiled",
                       help="specdec's rows compiled (the default), eager, or both side by side")
    add_model_options(bench)
    bench.set_defaults(run=_bench)
