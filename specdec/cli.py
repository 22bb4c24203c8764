"""The `specdec` command line: list the registered drafters, generate from a checkpoint.

    specdec drafters
    specdec generate --target DIR|ORG/NAME [--drafter NAME[:key=value,...]] [--k 4] [--chat] "prompt"
    specdec generate --target DIR --drafter eagle:path=HEAD --prompts FILE   # a batch: one prompt per line
    specdec zoo {build,info,path}            (specdec.cli_zoo)
    specdec train KIND --target DIR --data PATH... --out DIR   (specdec.cli_train)
    specdec bench [--target DIR] [--drafter SPEC]... [--k 4 auto]  (specdec.cli_bench)
    specdec verify [--target DIR] "prefix" "continuation"       (specdec.cli_verify)
    specdec trace [--target DIR] [--drafter SPEC] ["prompt"]     (specdec.cli_trace)
    specdec datastore build FILES... --tokenizer DIR --out DIR   (specdec.cli_datastore)

User errors print one line, `specdec: error: ...`, and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import Any


from specdec import plugins
from specdec.cli_bench import add_bench_command
from specdec.cli_common import CLIError, add_model_options, load_target, model_device, one_line, resolve_target
from specdec.cli_datastore import add_datastore_commands
from specdec.cli_export import add_export_command
from specdec.cli_play import add_play_command
from specdec.cli_trace import add_trace_command
from specdec.cli_train import add_train_command
from specdec.cli_verify import add_verify_command
from specdec.cli_zoo import add_zoo_commands
from specdec.generate import generate
from specdec.sharding import rank_zero_output
from specdec.types import Sampling, Stats

__all__ = ["main", "parse_drafter_spec", "parse_value", "stats_line"]

def parse_value(text: str) -> int | float | bool | str:
    """A drafter option value: an int, a float, true/false (any case), else the string itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def parse_drafter_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split `NAME` or `NAME:key=value,key=value` into the name and its typed options.

    Values go through `parse_value`; a value may contain `=` and `:` but not `,`.
    Raises ValueError naming the malformed part.
    """
    name, colon, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"drafter spec {spec!r} has no name; write NAME or NAME:key=value,...")
    options: dict[str, Any] = {}
    if not colon:
        return name, options
    if not rest.strip():
        raise ValueError(f"drafter spec {spec!r} has nothing after ':'; write NAME:key=value,... or just NAME")
    for item in rest.split(","):
        key, equals, value = item.partition("=")
        key = key.strip()
        if not equals or not key.isidentifier():
            raise ValueError(f"drafter option {item!r} in {spec!r} is not key=value (key a Python identifier)")
        if key in options:
            raise ValueError(f"drafter option {key!r} is given twice in {spec!r}")
        options[key] = parse_value(value)
    return name, options


def _registry() -> plugins.Registry:
    """The process registry; plugin failures are shown by the commands, not as warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            return plugins.registry()
        except plugins.DuplicateDrafterError as error:
            raise CLIError(one_line(error)) from None


def _summary(cls: type) -> str:
    doc = (cls.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else "(no docstring)"


def _drafters_command(args: argparse.Namespace) -> int:
    registry = _registry()
    rows = [(name, registry.origins[name], _summary(cls)) for name, cls in sorted(registry.drafters.items())]
    if not rows:
        print(f"no drafters registered (is {plugins.DISABLE_ENV} blocking them?)")
    name_width = max((len(row[0]) for row in rows), default=0)
    origin_width = max((len(row[1]) for row in rows), default=0)
    for name, origin, summary in rows:
        print(f"{name:<{name_width}}  {origin:<{origin_width}}  {summary}")
    for failure in registry.failures:
        print(f"plugin {failure.plugin!r} skipped: {failure.error}")
    return 0


def _make_drafter(spec: str | None) -> Any:
    if spec is None:
        return None
    try:
        name, options = parse_drafter_spec(spec)
    except ValueError as error:
        raise CLIError(one_line(error)) from None
    registry = _registry()
    for failure in registry.failures:
        print(f"specdec: warning: plugin {failure.plugin!r} skipped: {failure.error}", file=sys.stderr)
    try:
        return plugins.make_drafter(name, **options)
    except (ValueError, TypeError, OSError) as error:
        raise CLIError(one_line(error)) from None


def _tokenizer_eos_ids(tokenizer: Any, model: Any) -> list[int]:
    """EOS ids from the model's generation config and the tokenizer, merged."""
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    for value in (getattr(config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if value is not None:
            ids.update([value] if isinstance(value, int) else value)
    return sorted(ids)


def stats_line(stats: Stats) -> str:
    """One line of a generation's counters, as key=value pairs."""
    return (f"stats: steps={stats.steps} new_tokens={stats.new_tokens} "
            f"mean_accepted_length={stats.mean_accepted_length:.2f} acceptance_rate={stats.acceptance_rate:.3f} "
            f"tokens_per_second={stats.tokens_per_second:.1f} draft_seconds={stats.draft_seconds:.3f} "
            f"verify_seconds={stats.verify_seconds:.3f}")


def _prompt_ids(tokenizer: Any, text: str, chat: bool, target: str) -> list[int]:
    """The prompt's ids: raw text, or with --chat one user message through the chat template."""
    from specdec.chat import chat_ids, has_chat_template

    if not chat:
        return list(tokenizer.encode(text))
    if not has_chat_template(tokenizer):
        raise CLIError(f"--chat: the tokenizer of --target {target!r} has no chat template (tokenizer.chat_template "
                       "is None); drop --chat to use the prompt as raw text, or use a checkpoint whose "
                       "tokenizer_config.json or chat_template.jinja holds one")
    try:
        return chat_ids(tokenizer, [{"role": "user", "content": text}])
    except ValueError as error:
        raise CLIError(f"--chat: {one_line(error)}") from None


def read_prompts(path: str) -> list[str]:
    """The prompts of `specdec generate --prompts FILE`: a Spec-Bench question.jsonl (each
    question's first turn), else one prompt per non-empty line."""
    from pathlib import Path

    from specdec.bench.questions import load_questions

    file = Path(path)
    if not file.is_file():
        raise CLIError(f"--prompts {path!r} does not exist; give a file with one prompt per line or a Spec-Bench "
                       "question.jsonl")
    if file.suffix == ".jsonl":
        try:
            return [question.turns[0] for question in load_questions(file)]
        except ValueError as error:
            raise CLIError(one_line(error)) from None
    prompts = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise CLIError(f"--prompts {path!r} holds no prompt (one per line)")
    return prompts


def _generate_batch_command(args: argparse.Namespace, sampling: Sampling) -> int:
    """`specdec generate --prompts FILE`: every prompt in one batch (`specdec.generate_batch`)."""
    from specdec.generate_batch import generate_batch

    if args.prompt is not None:
        raise CLIError("give either a prompt or --prompts FILE, not both")
    if args.trace or args.show_steps:
        raise CLIError("--trace and --show-steps follow one generation; drop --prompts to trace one prompt")
    texts = read_prompts(args.prompts)
    model_device(args.device)
    target = resolve_target(args.target)
    drafter = _make_drafter(args.drafter)
    tokenizer, model = load_target(target, args)
    prompts = [_prompt_ids(tokenizer, text, args.chat, args.target) for text in texts]
    empty = [i + 1 for i, ids in enumerate(prompts) if not ids]
    if empty:
        raise CLIError(f"--prompts {args.prompts!r}: prompt {empty[0]} tokenises to no tokens")
    try:
        eos = _tokenizer_eos_ids(tokenizer, model) or None
        results = generate_batch(model, prompts, drafter=drafter, num_draft_tokens=args.k,
                                 max_new_tokens=args.max_new_tokens, sampling=sampling, eos_token_id=eos,
                                 seed=args.seed, compile=args.compile)
    except (ValueError, OSError) as error:
        raise CLIError(one_line(error)) from None
    for number, result in enumerate(results, start=1):
        print(f"--- prompt {number}")
        print(tokenizer.decode(result.tokens, skip_special_tokens=True))
        print(stats_line(result.stats))
    print(f"--- batch of {len(results)}")
    print(stats_line(results.totals))
    return 0


def _generate_command(args: argparse.Namespace) -> int:
    try:
        sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    except ValueError as error:
        raise CLIError(one_line(error)) from None
    for flag, value in (("--k", args.k), ("--max-new-tokens", args.max_new_tokens)):
        if value < 0:
            raise CLIError(f"{flag} must be >= 0, got {value}")
    if args.prompts is not None:
        return _generate_batch_command(args, sampling)
    if args.prompt is None:
        raise CLIError("give a prompt, or --prompts FILE for a batch")
    model_device(args.device)  # fail before any loading
    target = resolve_target(args.target)
    drafter = _make_drafter(args.drafter)
    tokenizer, model = load_target(target, args)
    prompt = _prompt_ids(tokenizer, args.prompt, args.chat, args.target)
    if not prompt:
        raise CLIError(f"the prompt {args.prompt!r} tokenises to no tokens; give a non-empty prompt")
    try:
        eos = _tokenizer_eos_ids(tokenizer, model) or None
        if args.trace or args.show_steps:
            from specdec.cli_trace import traced_generate

            result = traced_generate(model, tokenizer, prompt, drafter, args.k, args.max_new_tokens, sampling, eos,
                                     args.seed, args.trace, args.show_steps, compile=args.compile)
        else:
            result = generate(model, prompt, drafter=drafter, num_draft_tokens=args.k,
                              max_new_tokens=args.max_new_tokens, sampling=sampling, eos_token_id=eos,
                              seed=args.seed, compile=args.compile)
    except (ValueError, OSError) as error:
        raise CLIError(one_line(error)) from None
    print(tokenizer.decode(result.tokens, skip_special_tokens=True))
    print(stats_line(result.stats))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding with pluggable drafters.")
    commands = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")
    drafters = commands.add_parser("drafters", help="list the registered drafters and their plugins")
    drafters.set_defaults(run=_drafters_command)
    gen = commands.add_parser("generate", help="generate from a checkpoint, speculatively")
    gen.add_argument("prompt", nargs="?", default=None, help="the prompt text")
    gen.add_argument("--prompts", metavar="FILE", default=None,
                     help="decode a batch: one prompt per line, or a Spec-Bench question.jsonl (first turns)")
    gen.add_argument("--target", required=True, metavar="DIR|ORG/NAME",
                     help="model and tokenizer: a local directory or a hub id (org/name[@revision], from the "
                          "hub cache when HF_HUB_OFFLINE=1)")
    gen.add_argument("--chat", action="store_true",
                     help="send the prompt as one user message through the tokenizer's chat template")
    gen.add_argument("--drafter", metavar="NAME[:key=value,...]",
                     help="e.g. ngram:max_ngram=3 or draft-model:model=DIR (default: plain decoding)")
    gen.add_argument("--k", type=int, default=4, help="draft tokens per step (default 4)")
    gen.add_argument("--max-new-tokens", type=int, default=64, help="default 64")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="0 disables (default)")
    gen.add_argument("--top-p", type=float, default=1.0, help="1.0 disables (default)")
    gen.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    add_model_options(gen)
    gen.add_argument("--trace", metavar="FILE.html", default=None, help="write every step as a page")
    gen.add_argument("--show-steps", action="store_true", help="print every step, coloured by verdict")
    gen.set_defaults(run=_generate_command)
    add_zoo_commands(commands)
    add_train_command(commands)
    add_bench_command(commands)
    add_verify_command(commands)
    add_trace_command(commands)
    add_export_command(commands)
    add_datastore_commands(commands)
    add_play_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (argparse exits 2 itself on bad syntax)."""
    args = _parser().parse_args(argv)
    with rank_zero_output():
        try:
            return args.run(args)
        except CLIError as error:
            print(f"specdec: error: {error}", file=sys.stderr)
            return 2
