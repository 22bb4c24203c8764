"""Traces from the shell: `specdec generate ... --trace FILE.html --show-steps`, and
`specdec trace` (the zoo's target and EAGLE head by default) for learners."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specdec.cli.common import CLIError, add_model_options, load_target
from specdec.cli.sampling_options import add_verify_rule_option
from specdec.distributed.sharding import is_main_process
from specdec.errors import one_line

__all__ = ["add_trace_command", "traced_generate"]


def traced_generate(model: Any, tokenizer: Any, prompt: list[int], drafter: Any, k: int, max_new_tokens: int,
                    sampling: Any, eos: list[int] | None, seed: int | None, html: str | None,
                    show_steps: bool, compile: bool = False, verify_rule: str = "token") -> Any:
    """Generate with a trace; write the page and/or print the step view; returns the Generation."""
    from specdec.decoding.generate import generate
    from specdec.teaching.trace import Trace
    from specdec.teaching.trace_view import trace_html, trace_lines

    trace = Trace()
    result = generate(model, prompt, drafter=drafter, num_draft_tokens=k, max_new_tokens=max_new_tokens,
                      sampling=sampling, eos_token_id=eos, seed=seed, trace=trace, compile=compile,
                      tokenizer=tokenizer, verify_rule=verify_rule)

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids))

    if show_steps:
        for line in trace_lines(trace, decode, colour=sys.stdout.isatty()):
            print(line)
    if html:
        plain = generate(model, prompt, max_new_tokens=max_new_tokens, sampling=sampling, eos_token_id=eos, seed=seed,
                         compile=compile)
        per_token = plain.stats.wall_seconds / max(1, plain.stats.new_tokens)
        name = getattr(drafter, "name", "plain decoding") if drafter is not None else "plain decoding"
        if is_main_process():  # under torchrun, rank 0 writes the page
            Path(html).write_text(trace_html(trace, decode, per_token, f"specdec trace: {name}, k = {k}"),
                                  encoding="utf-8")
        print(f"wrote {html}")
    return result


def _trace(args: argparse.Namespace) -> int:
    from specdec import zoo
    from specdec.cli.common import parse_drafter_spec, stats_line
    from specdec.plugins import make_drafter
    from specdec.types import Sampling

    try:
        sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        directory = None
        if args.target is None:
            directory = zoo.ready(zoo.QUICK if args.quick else zoo.FULL, root=args.cache_dir)
        target = Path(args.target) if args.target else directory / "target"  # type: ignore[operator]
        name, options = parse_drafter_spec(args.drafter)
        if directory is not None:  # a zoo label (e.g. draft-model-xtok) makes its registered drafter
            options = options or zoo.drafter_options(directory).get(name, {})
            name = zoo.registry_name(name)
        drafter = make_drafter(name, **options)
        tokenizer, model = load_target(target, args)
        text = args.prompt
        if text is None:
            from specdec.data.corpus import stdlib_corpus
            from specdec.data.prompts import code_prompts

            text = code_prompts(stdlib_corpus(), per_category=1, categories=("signature",))[0].text
        prompt = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if not prompt:
            raise ValueError(f"the prompt {text!r} tokenises to no tokens; give a non-empty prompt")
        result = traced_generate(model, tokenizer, prompt, drafter, args.k, args.max_new_tokens, sampling, None,
                                 args.seed, args.out, not args.quiet, compile=args.compile,
                                 verify_rule=args.verify_rule)
    except (ValueError, TypeError, OSError, KeyError) as error:
        raise CLIError(one_line(error)) from None
    print(stats_line(result.stats))
    return 0


def add_trace_command(commands: Any) -> None:
    """Register `trace` under the top-level subparsers."""
    trace = commands.add_parser("trace", help="watch speculative decoding step by step (an HTML page)")
    trace.add_argument("prompt", nargs="?", default=None, help="default: a held-out function signature")
    trace.add_argument("--target", metavar="DIR|ORG/NAME", default=None, help="default: the zoo's target")
    trace.add_argument("--drafter", default="eagle", metavar="NAME[:key=value,...]",
                       help="default eagle (with the zoo, its checkpoint is found)")
    trace.add_argument("--quick", action="store_true", help="without --target: the quick zoo")
    trace.add_argument("--cache-dir", metavar="DIR", default=None)
    trace.add_argument("--k", type=int, default=4)
    trace.add_argument("--max-new-tokens", type=int, default=48)
    trace.add_argument("--temperature", type=float, default=0.0)
    trace.add_argument("--top-k", type=int, default=0)
    trace.add_argument("--top-p", type=float, default=1.0)
    trace.add_argument("--seed", type=int, default=0)
    trace.add_argument("--out", default="trace.html", metavar="FILE", help="default ./trace.html")
    trace.add_argument("--quiet", action="store_true", help="no step view in the terminal")
    add_verify_rule_option(trace, default="token")  # it teaches the token-wise rule first (docs/learn.md)
    add_model_options(trace)
    trace.set_defaults(run=_trace)
