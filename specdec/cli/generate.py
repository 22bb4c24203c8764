"""`specdec generate`: decode one prompt (or, with `--prompts FILE`, a batch) from a checkpoint,
speculatively with the drafter a spec names, or plainly."""

from __future__ import annotations

import argparse
from typing import Any

from specdec.cli.common import (CLIError, add_model_options, drafter_from_spec, load_target, model_device,
                                resolve_target, stats_line)
from specdec.cli.sampling_options import add_penalty_options, add_verify_rule_option, sampling_from
from specdec.decoding.generate import generate
from specdec.errors import one_line
from specdec.types import Sampling

__all__ = ["add_generate_command", "read_prompts"]


def _tokenizer_eos_ids(tokenizer: Any, model: Any) -> list[int]:
    """EOS ids from the model's generation config and the tokenizer, merged."""
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    for value in (getattr(config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if value is not None:
            ids.update([value] if isinstance(value, int) else value)
    return sorted(ids)


def _prompt_ids(tokenizer: Any, text: str, chat: bool, target: str) -> list[int]:
    """The prompt's ids: raw text, or with --chat one user message through the chat template."""
    from specdec.data.chat import chat_ids, has_chat_template

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
    from specdec.decoding.generate import generate_batch

    if args.prompt is not None:
        raise CLIError("give either a prompt or --prompts FILE, not both")
    if args.trace or args.show_steps:
        raise CLIError("--trace and --show-steps follow one generation; drop --prompts to trace one prompt")
    texts = read_prompts(args.prompts)
    model_device(args.device)
    target = resolve_target(args.target)
    drafter = drafter_from_spec(args.drafter)
    tokenizer, model = load_target(target, args)
    prompts = [_prompt_ids(tokenizer, text, args.chat, args.target) for text in texts]
    empty = [i + 1 for i, ids in enumerate(prompts) if not ids]
    if empty:
        raise CLIError(f"--prompts {args.prompts!r}: prompt {empty[0]} tokenises to no tokens")
    try:
        eos = _tokenizer_eos_ids(tokenizer, model) or None
        results = generate_batch(model, prompts, drafter=drafter, num_draft_tokens=args.k,
                                 max_new_tokens=args.max_new_tokens, sampling=sampling, eos_token_id=eos,
                                 seed=args.seed, compile=args.compile, tokenizer=tokenizer,
                                 verify_rule=args.verify_rule)
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
    sampling = sampling_from(args, args.temperature)
    for flag, value in (("--k", args.k), ("--max-new-tokens", args.max_new_tokens)):
        if value < 0:
            raise CLIError(f"{flag} must be >= 0, got {value}")
    if args.prompts is not None:
        return _generate_batch_command(args, sampling)
    if args.prompt is None:
        raise CLIError("give a prompt, or --prompts FILE for a batch")
    model_device(args.device)  # fail before any loading
    target = resolve_target(args.target)
    drafter = drafter_from_spec(args.drafter)
    tokenizer, model = load_target(target, args)
    prompt = _prompt_ids(tokenizer, args.prompt, args.chat, args.target)
    if not prompt:
        raise CLIError(f"the prompt {args.prompt!r} tokenises to no tokens; give a non-empty prompt")
    try:
        eos = _tokenizer_eos_ids(tokenizer, model) or None
        if args.trace or args.show_steps:
            from specdec.cli.trace import traced_generate

            result = traced_generate(model, tokenizer, prompt, drafter, args.k, args.max_new_tokens, sampling, eos,
                                     args.seed, args.trace, args.show_steps, compile=args.compile,
                                     verify_rule=args.verify_rule)
        else:
            result = generate(model, prompt, drafter=drafter, num_draft_tokens=args.k,
                              max_new_tokens=args.max_new_tokens, sampling=sampling, eos_token_id=eos,
                              seed=args.seed, compile=args.compile, tokenizer=tokenizer,
                              verify_rule=args.verify_rule)
    except (ValueError, OSError) as error:
        raise CLIError(one_line(error)) from None
    print(tokenizer.decode(result.tokens, skip_special_tokens=True))
    print(stats_line(result.stats))
    return 0


def add_generate_command(commands: Any) -> None:
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
    add_penalty_options(gen)
    add_verify_rule_option(gen)
    gen.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    add_model_options(gen)
    gen.add_argument("--trace", metavar="FILE.html", default=None, help="write every step as a page")
    gen.add_argument("--show-steps", action="store_true", help="print every step, coloured by verdict")
    gen.set_defaults(run=_generate_command)
