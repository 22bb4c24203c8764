"""`make demo`: plain vs n-gram vs draft-model decoding, side by side, on models trained here.

This stands in until the project's trained model zoo exists. Random tiny models would give a
draft model almost no acceptance, so the demo first trains two small byte-level Llama models
(nothing is downloaded, no tokenizer is needed: token ids are UTF-8 bytes) on a few of the
Python standard library's own source files, then decodes the opening of a held-out stdlib file
with `specdec.generate`:

- target: a 4-layer Llama (hidden 96); draft: a 1-layer Llama (hidden 64); both float32,
  trained with AdamW on the same byte windows, seeded, in about half a minute on two cores.
  Models this small babble code-flavoured text, and greedy decoding falls into loops; what
  they share is enough for the draft model to predict the target often.
- greedy rows must reproduce plain greedy decoding token for token ("same as plain");
  the temperature-0.8 rows show that sampling keeps drafting useful.

Tokens/s and speedup are wall-clock figures of tiny models on CPU, where per-forward overhead
dominates; mean accepted length (tokens per target forward) is the machine-independent number.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import sysconfig
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import specdec
from specdec import Sampling

TRAIN_MODULES = ("argparse", "calendar", "contextlib", "dataclasses", "functools", "shlex",
                 "string", "textwrap")  # stdlib sources every CPython ships; sorted
PROMPT_MODULE = "bisect"  # held out of training; its opening is the prompt
VOCAB_SIZE = 256  # one id per byte
PEAK_LEARNING_RATE = 3e-3


@dataclass(frozen=True)
class ModelSize:
    layers: int
    hidden: int


@dataclass(frozen=True)
class Settings:
    target: ModelSize
    draft: ModelSize
    steps: int  # AdamW steps, both models
    batch: int  # windows per step
    window: int  # bytes per window
    prompt_bytes: int  # the prompt is at most this long, cut after a word
    repeats: int  # timed runs per table row; the fastest counts


DEFAULT = Settings(ModelSize(4, 96), ModelSize(1, 64), steps=300, batch=4, window=256,
                   prompt_bytes=120, repeats=2)
QUICK = Settings(ModelSize(2, 32), ModelSize(1, 16), steps=20, batch=2, window=64,
                 prompt_bytes=120, repeats=1)


@dataclass(frozen=True)
class Row:
    """One line of the comparison table."""

    drafter: str
    sampling: str
    new_tokens: int
    steps: int
    mean_accepted_length: float
    acceptance_rate: float | None  # None for plain decoding (nothing drafted)
    tokens_per_second: float
    speedup: float
    same_as_plain: str  # "yes" / "NO" for greedy rows, "n/a" for sampled ones


def stdlib_source(module: str) -> bytes:
    """The source of a standard-library module, read from the interpreter's stdlib directory."""
    path = Path(sysconfig.get_paths()["stdlib"], *module.split(".")).with_suffix(".py")
    if not path.is_file():
        raise FileNotFoundError(f"the demo trains on the standard library's sources, but {path} is "
                                "missing; use a Python installation that ships its .py files")
    return path.read_bytes()


def training_ids() -> torch.Tensor:
    """The training files' bytes, concatenated in sorted order: LongTensor [N]."""
    text = b"\n\n".join(stdlib_source(name) for name in sorted(TRAIN_MODULES))
    return torch.tensor(list(text), dtype=torch.long)


def prompt_ids(prompt_bytes: int) -> torch.Tensor:
    """The held-out file's opening, about `prompt_bytes` long, ending after a word: LongTensor [P]."""
    opening = stdlib_source(PROMPT_MODULE)[:prompt_bytes]
    opening = opening[: opening.rfind(b" ")] or opening  # stop mid-sentence, not at a line end
    return torch.tensor(list(opening), dtype=torch.long)


def available_cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def build_model(size: ModelSize, seed: int) -> LlamaForCausalLM:
    """A randomly initialised byte-level Llama of the given size, float32."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=size.hidden, intermediate_size=2 * size.hidden,
                         num_hidden_layers=size.layers, num_attention_heads=4, num_key_value_heads=4,
                         head_dim=size.hidden // 4, max_position_embeddings=1024,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    return LlamaForCausalLM(config).to(torch.float32)


def _learning_rate(step: int, steps: int, peak: float = PEAK_LEARNING_RATE) -> float:
    """Linear warm-up over the first 10% of steps, then cosine decay to 10% of the peak."""
    warmup = max(1, steps // 10)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(models: dict[str, LlamaForCausalLM], data: torch.Tensor, settings: Settings, seed: int) -> None:
    """Train every model on the same random byte windows (next-byte cross-entropy), in place."""
    generator = torch.Generator().manual_seed(seed)
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=PEAK_LEARNING_RATE, weight_decay=0.01)
                  for name, model in models.items()}
    for model in models.values():
        model.train()
    start = time.perf_counter()
    for step in range(settings.steps):
        starts = torch.randint(0, data.shape[0] - settings.window, (settings.batch,), generator=generator)
        batch = torch.stack([data[s : s + settings.window] for s in starts.tolist()])  # (B, W)
        losses = {}
        for name, model in models.items():
            for group in optimizers[name].param_groups:
                group["lr"] = _learning_rate(step, settings.steps)
            loss = model(input_ids=batch, labels=batch).loss
            optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizers[name].step()
            losses[name] = loss.item()
        _progress(step + 1, settings.steps, losses, time.perf_counter() - start)
    for model in models.values():
        model.eval()


def _progress(step: int, steps: int, losses: dict[str, float], seconds: float) -> None:
    """One overwritten progress line on a terminal; about ten lines otherwise."""
    terminal = sys.stdout.isatty()
    if not terminal and step != steps and step % max(1, steps // 10):
        return
    width = 24
    bar = "#" * (width * step // steps)
    bits = "  ".join(f"{name} {loss / math.log(2):.2f}" for name, loss in losses.items())
    line = f"  train [{bar:<{width}}] {step:>4}/{steps}  bits/byte: {bits}  {seconds:5.1f}s"
    print("\r" + line if terminal else line, end="\n" if step == steps or not terminal else "", flush=True)


@torch.no_grad()
def bits_per_byte(model: LlamaForCausalLM, ids: torch.Tensor, window: int) -> float:
    """Mean next-byte cross-entropy of `model` on ids [T] in bits, over windows of the training length."""
    chunks = ids[: ids.shape[0] // window * window].view(-1, window)  # (n, W)
    return model(input_ids=chunks, labels=chunks).loss.item() / math.log(2)


def run(target: LlamaForCausalLM, prompt: torch.Tensor, drafter_name: str | None,
        draft_model: LlamaForCausalLM, sampling: Sampling, args: argparse.Namespace,
        repeats: int) -> specdec.Generation:
    """`specdec.generate` with a fresh drafter; the fastest of `repeats` runs (same seed, same tokens)."""
    best: specdec.Generation | None = None
    for _ in range(repeats):
        options = {"model": draft_model} if drafter_name == "draft-model" else {}
        drafter = None if drafter_name is None else specdec.make_drafter(drafter_name, **options)
        result = specdec.generate(target, prompt, drafter=drafter, num_draft_tokens=args.k,
                                  max_new_tokens=args.new_tokens, sampling=sampling, seed=args.seed)
        if best is None or result.stats.wall_seconds < best.stats.wall_seconds:
            best = result
    assert best is not None
    return best


def compare(target: LlamaForCausalLM, draft_model: LlamaForCausalLM, prompt: torch.Tensor,
            args: argparse.Namespace, repeats: int) -> tuple[list[Row], dict[str, list[int]]]:
    """Table rows for every drafter, greedy and at temperature 0.8, and plain decoding's tokens of each."""
    rows: list[Row] = []
    plain_tokens: dict[str, list[int]] = {}
    for sampling, label in ((Sampling(), "greedy"), (Sampling(temperature=0.8), "T=0.8")):
        plain = run(target, prompt, None, draft_model, sampling, args, repeats)
        plain_tokens[label] = plain.tokens
        for name in (None, "ngram", "draft-model"):
            result = plain if name is None else run(target, prompt, name, draft_model, sampling, args, repeats)
            stats = result.stats
            same = ("yes" if result.tokens == plain.tokens else "NO") if sampling.greedy else "n/a"
            rows.append(Row(name or "plain", label, stats.new_tokens, stats.steps, stats.mean_accepted_length,
                            stats.acceptance_rate if name else None, stats.tokens_per_second,
                            stats.tokens_per_second / plain.stats.tokens_per_second, same))
    return rows, plain_tokens


HEADER = ("drafter", "sampling", "new tokens", "target forwards", "mean acc. len", "acceptance",
          "tokens/s", "speedup", "same as plain")


def table(rows: list[Row]) -> str:
    """The rows as an aligned text table, one header line and a rule."""
    cells = [HEADER] + [
        (r.drafter, r.sampling, str(r.new_tokens), str(r.steps), f"{r.mean_accepted_length:.2f}",
         "-" if r.acceptance_rate is None else f"{r.acceptance_rate:.0%}", f"{r.tokens_per_second:.0f}",
         f"{r.speedup:.2f}x", r.same_as_plain)
        for r in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADER))]
    render = lambda line: "  ".join(c.ljust(w) if i < 2 else c.rjust(w)  # noqa: E731
                                    for i, (c, w) in enumerate(zip(line, widths)))
    return "\n".join([render(cells[0]), "  ".join("-" * w for w in widths)] + [render(c) for c in cells[1:]])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="training steps for both models "
                        f"(default {DEFAULT.steps}; {QUICK.steps} with --quick)")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens (bytes) to generate")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step")
    parser.add_argument("--quick", action="store_true", help="tiny models and few steps (a few seconds)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights, batches and sampling")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for training (default: the CPUs available); decoding uses one")
    args = parser.parse_args(argv)
    for field in ("steps", "new_tokens", "k", "threads"):
        value = getattr(args, field)
        if value is not None and value < 1:
            parser.error(f"--{field.replace('_', '-')} must be >= 1, got {value}")
    return args


def prepare_models(settings: Settings, seed: int) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """Build and train the target and the draft model, reporting progress and held-out bits/byte."""
    data = training_ids()
    target = build_model(settings.target, seed)
    draft = build_model(settings.draft, seed + 1)
    count = lambda model: f"{sum(p.numel() for p in model.parameters()):,}"  # noqa: E731
    print(f"Training on {data.shape[0]:,} bytes of stdlib source ({', '.join(TRAIN_MODULES)}), "
          f"{torch.get_num_threads()} thread(s):")
    print(f"  target: Llama, {settings.target.layers} layers x {settings.target.hidden} ({count(target)} "
          f"params); draft: {settings.draft.layers} layer x {settings.draft.hidden} ({count(draft)} params)")
    tick = time.perf_counter()
    train({"target": target, "draft": draft}, data, settings, seed)
    held_out = torch.tensor(list(stdlib_source(PROMPT_MODULE)), dtype=torch.long)
    scores = [bits_per_byte(model, held_out, settings.window) for model in (target, draft)]
    print(f"  trained in {time.perf_counter() - tick:.1f}s; bits/byte on the held-out {PROMPT_MODULE}.py: "
          f"target {scores[0]:.2f}, draft {scores[1]:.2f}\n")
    return target, draft


def show_text(prompt: torch.Tensor, continuations: dict[str, list[int]]) -> None:
    """Print the prompt and plain decoding's continuations (bytes decoded leniently)."""
    text = lambda ids: bytes(ids).decode("utf-8", errors="replace")  # noqa: E731
    print(f"Prompt (the opening of the held-out {PROMPT_MODULE}.py, {prompt.shape[0]} bytes):")
    print(text(prompt.tolist()))
    for label, tokens in continuations.items():
        print(f"--- {label} continuation, {len(tokens)} bytes ---")
        print(text(tokens))
    print("---\n")


LEGEND = """\
target forwards: verify steps after the prefill; mean acc. len: new tokens per target forward
(bonus included); acceptance: accepted / drafted tokens; same as plain: greedy tokens identical
to plain greedy decoding, as lossless speculative decoding guarantees. Models this small cost
mostly fixed per-call overhead, so here a 1-layer draft forward costs about a third of a target
forward (a few percent for real model pairs): tokens/s understates what the acceptance buys."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else DEFAULT
    if args.steps is not None:
        settings = replace(settings, steps=args.steps)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or available_cpus())
    try:
        began = time.perf_counter()
        target, draft = prepare_models(settings, args.seed)
        torch.set_num_threads(1)  # models this small decode fastest on one thread
        prompt = prompt_ids(settings.prompt_bytes)
        warm_up = argparse.Namespace(**{**vars(args), "new_tokens": 8})
        run(target, prompt, "draft-model", draft, Sampling(), warm_up, 1)  # one-off setup costs
        rows, continuations = compare(target, draft, prompt, args, settings.repeats)
        show_text(prompt, continuations)
        print(f"k = {args.k}, {args.new_tokens} new tokens, one thread; tokens/s of the fastest of "
              f"{settings.repeats} run(s) per row:")
        print(table(rows))
        print(f"\n{LEGEND}\nTotal {time.perf_counter() - began:.1f}s.")
    finally:
        torch.set_num_threads(previous_threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
