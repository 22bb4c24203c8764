"""What the sampling settings cost per verify step: the pipeline's time to turn a draft's k + 1
rows of logits into distributions, each row from its own prefix, against plain top-p sampling.

    .venv/bin/python examples/sampling_cost.py [--tokenizer DIR] [--vocab 49152 ...] [--k 4]

Settings measured: temperature with top-p (no prefix read: one batched softmax); the penalties
with min-p (counts of each row's prefix, one scatter, on the tensors' device); the same with a
history-dependent transformers LogitsProcessor (called on the host once per row with the row's
whole prefix); and a JSON schema (xgrammar's masks, one accept and one mask per row, then a
rollback), on the tokenizer's vocabulary (default: the shipped full zoo's, 2,048 ids); then at each
--vocab size without the schema (default 49,152, SmolLM2's). The committed text is 256 random ids,
for the schema the ids of a JSON prefix (about 15). Each column adds to the one before it but the
schema's, which is top-p with the schema alone. One thread; each figure is the median of --repeats timed steps.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import LogitsProcessor

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "lines": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "lines", "tags"], "additionalProperties": False}
COMMITTED = 256


class AfterSameId(LogitsProcessor):
    """A history-dependent processor: the id that ended the prefix gets -1 (transformers' calling form)."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return scores.scatter_add(1, input_ids[:, -1:], torch.full_like(scores[:, :1], -1.0))


def step_seconds(sampling: Any, vocab: int, k: int, repeats: int, tokenizer: Any = None,
                 committed: list[int] | None = None, draft: list[int] | None = None) -> float:
    """The median seconds of one verify's processing: logits [k + 1, V] -> p [k + 1, V]."""
    from specdec.processing import Pipeline, Prefixes
    from specdec.processing.constraint import Matcher, compile_constraint

    generator = torch.Generator().manual_seed(0)
    ids = committed if committed is not None else torch.randint(vocab, (COMMITTED,), generator=generator).tolist()
    tokens = draft if draft is not None else torch.randint(vocab, (k,), generator=generator).tolist()
    matcher = None
    prompt_length = len(ids) // 2
    if sampling.constraint is not None:
        kind, text = sampling.constraint
        matcher = Matcher(compile_constraint(kind, text, tokenizer, vocab), vocab)
        prompt_length = 0
        matcher.advance(ids)
    pipeline = Pipeline(sampling, vocab, prompt_length, matcher)
    logits = torch.randn(k + 1, vocab, generator=generator)
    prefixes = Prefixes.of_verify(torch.tensor(ids), prompt_length, torch.tensor(tokens), None)
    rows = prefixes if sampling.reads_prefix else None
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        pipeline.probabilities(logits, rows)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="*", default=[49152], help="more vocabulary sizes")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--tokenizer", default=None, help="for the JSON schema (default: the shipped full zoo's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from specdec import Sampling
    from specdec.checkpoints import load_tokenizer

    if args.tokenizer is None:
        from specdec import zoo

        args.tokenizer = str(zoo.ready(zoo.FULL, show_progress=False) / "tokenizer")
    tokenizer = load_tokenizer(Path(args.tokenizer))
    plain = Sampling(temperature=0.8, top_p=0.95)
    penalised = Sampling(temperature=0.8, top_p=0.95, min_p=0.05, repetition_penalty=1.3, presence_penalty=0.5,
                         frequency_penalty=0.2)
    processed = Sampling(temperature=0.8, top_p=0.95, min_p=0.05, repetition_penalty=1.3, presence_penalty=0.5,
                         frequency_penalty=0.2, logits_processors=[AfterSameId()])
    print(f"one verify of k = {args.k} ({args.k + 1} rows), {COMMITTED} committed ids, one thread; median of "
          f"{args.repeats}")
    print(f"{'vocabulary':>10}  {'top-p':>8}  {'+ penalties, min-p':>18}  {'+ a processor':>13}  {'JSON schema':>11}")
    for vocab in [len(tokenizer), *args.vocab]:
        base = step_seconds(plain, vocab, args.k, args.repeats)
        cells = [f"{base * 1e6:>6.0f} µs"]
        for sampling in (penalised, processed):
            seconds = step_seconds(sampling, vocab, args.k, args.repeats)
            cells.append(f"{seconds * 1e6:.0f} µs (+{(seconds - base) * 1e6:.0f})")
        if vocab == len(tokenizer):
            text = tokenizer('{"name": "parse", "lines": 12, "tags": ["io", "', add_special_tokens=False)["input_ids"]
            schema = Sampling(temperature=0.8, top_p=0.95, json_schema=SCHEMA)
            seconds = step_seconds(schema, vocab, args.k, args.repeats, tokenizer, text[:-args.k], text[-args.k:])
            cells.append(f"{seconds * 1e6:.0f} µs (+{(seconds - base) * 1e6:.0f})")
        else:
            cells.append("-")
        print(f"{vocab:>10}  {cells[0]:>8}  {cells[1]:>18}  {cells[2]:>13}  {cells[3]:>11}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
