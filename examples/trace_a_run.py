"""Watch speculative decoding step by step: decode a held-out prompt of the zoo with the EAGLE
head, record a trace, print each step in the terminal and write the HTML page.

    python examples/trace_a_run.py                  # the full zoo (the shipped family)
    python examples/trace_a_run.py --temperature 0.8 --out trace.html
"""

from __future__ import annotations

import argparse
import sys

import specdec
from specdec import zoo
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.data.corpus import stdlib_corpus
from specdec.data.prompts import code_prompts
from specdec.teaching.trace import Trace
from specdec.teaching.trace_view import trace_html, trace_lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", default="eagle", choices=["ngram", "draft-model", "medusa", "eagle", "mtp"])
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--out", default="trace.html")
    parser.add_argument("--quick", action="store_true", help="the quick zoo")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)

    directory = zoo.ready(zoo.QUICK if args.quick else zoo.FULL, root=args.cache_dir)
    tokenizer = load_tokenizer(directory / "target")
    target = specdec.CausalLM(load_causal_lm(directory / "target"))
    prompt = code_prompts(stdlib_corpus(), per_category=1, categories=("signature",))[0]
    ids = tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
    drafter = specdec.make_drafter(args.drafter, **zoo.drafter_options(directory)[args.drafter])

    trace = Trace()
    sampling = specdec.Sampling(temperature=args.temperature)
    result = specdec.generate(target, ids, drafter=drafter, num_draft_tokens=4, max_new_tokens=args.new_tokens,
                              sampling=sampling, seed=0, trace=trace)
    plain = specdec.generate(target, ids, max_new_tokens=args.new_tokens, sampling=sampling, seed=0)

    def decode(tokens: list[int]) -> str:
        return str(tokenizer.decode(tokens))

    print(prompt.text, end="")
    for line in trace_lines(trace, decode, colour=sys.stdout.isatty()):
        print(line)
    per_token = plain.stats.wall_seconds / plain.stats.new_tokens
    with open(args.out, "w", encoding="utf-8") as page:
        page.write(trace_html(trace, decode, per_token, f"{args.drafter} on {prompt.source}"))
    print(f"{result.stats.steps} target forwards for {result.stats.new_tokens} tokens "
          f"(mean accepted length {result.stats.mean_accepted_length:.2f}); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
