"""What quantizing a target costs in quality: its held-out loss, float32 against quantized, how
often the two pick the same next token, and how far their greedy decodings run together, as
docs/engine.md reports it (*Quantized weights*).

    python -m specdec.bench.quantization --family full      # the zoo's family: its own evaluation
    python -m specdec.bench.quantization --target DIR       # any checkpoint: standard-library text

A family is measured on its evaluation windows and prompts (`specdec zoo info` reports the same
windows' float32 loss); a checkpoint on held-out standard-library files, windows of `--length`
tokens, each window's first `--prompt-length` tokens a prompt. Decoding is greedy and eager.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["QuantizationError", "compare", "main", "stdlib_windows"]


@dataclass(frozen=True)
class QuantizationError:
    """Float32 against quantized on the same windows and prompts."""

    scheme: str
    float_loss: float  # nats per token over the windows
    quantized_loss: float
    next_token_agreement: float  # fraction of window positions where both argmaxes are the same token
    greedy_common_prefix: float  # mean fraction of a greedy decoding's new tokens before the two first differ
    greedy_identical: float  # fraction of prompts whose greedy decodings are identical
    windows: int
    tokens_per_window: int
    prompts: int
    new_tokens: int


@torch.inference_mode()
def _losses_and_argmax(model: torch.nn.Module, windows: torch.Tensor, batch: int = 4) -> tuple[float, torch.Tensor]:
    """(mean next-token loss, argmax ids [n, T - 1]) of `model` over windows [n, T]."""
    total, picks = 0.0, []
    for start in range(0, windows.shape[0], batch):
        ids = windows[start : start + batch]
        logits = model(input_ids=ids).logits[:, :-1].float()  # (b, T - 1, V)
        total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum"))
        picks.append(logits.argmax(-1))
    return total / (windows.shape[0] * (windows.shape[1] - 1)), torch.cat(picks)


def _greedy(model: torch.nn.Module, prompts: Sequence[list[int]], new_tokens: int) -> list[list[int]]:
    from specdec.decoding.generate import generate

    return [generate(model, prompt, max_new_tokens=new_tokens).tokens for prompt in prompts]


def _common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(model: torch.nn.Module, windows: torch.Tensor, prompts: Sequence[list[int]], scheme: str = "int8",
            new_tokens: int = 64) -> QuantizationError:
    """Measure `model` (float, left as it is) against a quantized copy of it."""
    from specdec.runtime.quantize import quantize

    quantized = quantize(copy.deepcopy(model), scheme)
    float_loss, float_picks = _losses_and_argmax(model, windows)
    quantized_loss, quantized_picks = _losses_and_argmax(quantized, windows)
    plain, quantized_plain = _greedy(model, prompts, new_tokens), _greedy(quantized, prompts, new_tokens)
    common = [_common(a, b) / max(len(a), 1) for a, b in zip(plain, quantized_plain)]
    return QuantizationError(scheme, float_loss, quantized_loss,
                             float((float_picks == quantized_picks).float().mean()), sum(common) / len(common),
                             sum(a == b for a, b in zip(plain, quantized_plain)) / len(plain),
                             int(windows.shape[0]), int(windows.shape[1]), len(prompts), new_tokens)


def stdlib_windows(tokenizer: Any, count: int, length: int) -> torch.Tensor:
    """`count` windows [count, length] of token ids: each the start of one held-out standard-library
    file long enough (`specdec.data.corpus`), in the corpus's order."""
    from specdec.data.corpus import read_text, stdlib_corpus

    rows = []
    for path in stdlib_corpus().heldout:
        text = read_text(path)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        if len(ids) >= length:
            rows.append(ids[:length])
        if len(rows) == count:
            break
    if len(rows) < count:
        raise ValueError(f"only {len(rows)} held-out files give {length} tokens; ask for fewer windows or shorter")
    return torch.tensor(rows)


def _family(name: str) -> tuple[torch.nn.Module, torch.Tensor, list[list[int]]]:
    from specdec.checkpoints import load_causal_lm, load_tokenizer
    from specdec.zoo.measure import read_evaluation
    from specdec.zoo.settings import family
    from specdec.zoo.shipped import ready

    directory = ready(family(name))
    evaluation = read_evaluation(directory)
    tokenizer = load_tokenizer(directory / "tokenizer")
    prompts = [tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in evaluation.prompts]
    return load_causal_lm(directory / "target"), evaluation.windows, prompts


def main(argv: Sequence[str] | None = None) -> int:
    from specdec.checkpoints import load_causal_lm, load_tokenizer
    from specdec.runtime.quantize import SCHEMES

    parser = argparse.ArgumentParser(prog="python -m specdec.bench.quantization", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--family", help="a zoo family (full, quick, hybrid): its target, windows and prompts")
    source.add_argument("--target", type=Path, help="a checkpoint directory or GGUF file")
    parser.add_argument("--scheme", choices=SCHEMES, default="int8")
    parser.add_argument("--windows", type=int, default=24, help="with --target: held-out windows (default 24)")
    parser.add_argument("--length", type=int, default=256, help="with --target: tokens per window (default 256)")
    parser.add_argument("--prompts", type=int, default=12, help="prompts decoded greedily (default 12)")
    parser.add_argument("--prompt-length", type=int, default=48, help="with --target: a prompt's tokens (default 48)")
    parser.add_argument("--new-tokens", type=int, default=64, help="per greedy decoding (default 64)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if args.family:
        model, windows, prompts = _family(args.family)
    else:
        model = load_causal_lm(args.target)
        windows = stdlib_windows(load_tokenizer(args.target), args.windows, args.length)
        prompts = [row[: args.prompt_length].tolist() for row in windows]
    result = compare(model, windows, prompts[: args.prompts], args.scheme, args.new_tokens)
    print(f"{args.family or args.target}: {args.scheme} against float32 on {result.windows} windows of "
          f"{result.tokens_per_window} tokens, {result.prompts} greedy decodings of {result.new_tokens} tokens")
    print(f"  held-out loss {result.float_loss:.4f} -> {result.quantized_loss:.4f} nats/token "
          f"({result.quantized_loss - result.float_loss:+.4f})")
    print(f"  next-token agreement {result.next_token_agreement:.4f}; greedy: {result.greedy_common_prefix:.3f} of the "
          f"new tokens before the first difference, {result.greedy_identical:.2f} of decodings identical")
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
