"""`num_draft_tokens="auto"` against a fixed k on a real model (`docs/engine.md`, *Drafting only
when it pays*): SmolLM2-135M-Instruct on the first 6 Spec-Bench questions of the bench's sample
through its chat template, 64 greedy tokens each, compiled (packed weights), two timed rounds
after a warm-up decode; tokens/s over the 6 prompts, the mean accepted length, and whether the
tokens are plain decoding's.

    .venv/bin/python examples/auto_draft_length.py [--quantize int8] [--model DIR | --quick] [--prompts 6]

Run it alone: a second job on 2 cores makes the timings meaningless.
"""

from __future__ import annotations

import argparse
import statistics
import time

import specdec
from specdec.bench.questions import load_questions
from specdec.bench.real import QUESTIONS
from specdec.bench.real import example_model
from specdec.checkpoints import load_causal_lm, load_tokenizer, quiet_transformers
from specdec.runtime.quantize import SCHEMES

ROWS = (("plain", None, 4), ("ngram k=4", "ngram", 4), ("ngram auto", "ngram", "auto"),
        ("suffix k=4", "suffix", 4), ("suffix auto", "suffix", "auto"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a causal LM directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--quick", action="store_true", help="the quick zoo's target (built here in under a minute)")
    parser.add_argument("--cache-dir", default=None, help="zoo cache directory (default: the user cache)")
    parser.add_argument("--quantize", choices=SCHEMES, default=None)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    path, tokenizer_path = example_model(args.quick, args.model, args.cache_dir)
    with quiet_transformers():
        model = load_causal_lm(path, quantize=args.quantize).eval()
    tokenizer = load_tokenizer(tokenizer_path)
    questions = load_questions(QUESTIONS)[: args.prompts]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q.turns[0]}], add_generation_prompt=True,
                                           tokenize=False) if tokenizer.chat_template else q.turns[0]
             for q in questions]
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    reference = None
    for label, drafter, k in ROWS:
        specdec.generate(model, prompts[0], drafter=drafter, num_draft_tokens=k, max_new_tokens=args.new_tokens,
                         compile=True)  # compiles the row's graphs outside the timings
        rates, outputs, lengths = [], [], []
        for _ in range(args.repeats):
            began, total = time.perf_counter(), 0
            for prompt in prompts:
                result = specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=k,
                                          max_new_tokens=args.new_tokens, compile=True)
                total += len(result.tokens)
                outputs.append(result.tokens)
                lengths.append(result.stats.mean_accepted_length)
            rates.append(total / (time.perf_counter() - began))
        reference = outputs if reference is None else reference
        print(f"{args.quantize or 'float32'} {label}: {' '.join(f'{r:.1f}' for r in rates)} tok/s, mean accepted "
              f"length {statistics.fmean(lengths):.2f}, tokens equal to plain decoding's: {outputs == reference}",
              flush=True)


if __name__ == "__main__":
    main()
