"""DDTree's curve on the zoo: the mean accepted length and the speed of the family's DFlash drafter
drafting trees of N nodes (the N best prefixes of its one block forward, `docs/drafters.md`),
against its chain and plain decoding, on the family's held-out prompts.

    .venv/bin/python examples/ddtree_curve.py [--hybrid | --quick] [--budgets 8 16 32 64] [--top-k 8]

Every row decodes the same prompts at the family's temperature and seeds (prompt i: seed + i), k =
the drafter's block minus one, eagerly, after one warm-up decode; tokens/s is
the new tokens over the decoding seconds. Run it alone: a second job on 2 cores makes the timings
meaningless.
"""

from __future__ import annotations

import argparse
import time

import torch

import specdec
from specdec import zoo
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.data.prompts import first_per_category
from specdec.zoo.measure import read_evaluation


def decode_all(target: specdec.CausalLM, prompts: list[torch.Tensor], make: object, k: int, new_tokens: int,
               sampling: specdec.Sampling, seed: int) -> tuple[float, float]:
    """(mean accepted length, tokens per second) of every prompt decoded by a fresh drafter from `make`
    (None: plain decoding), after one warm-up decode of the first prompt."""
    def drafter() -> object:
        return make() if callable(make) else None

    specdec.generate(target, prompts[0], drafter=drafter(), num_draft_tokens=k, max_new_tokens=k + 1, sampling=sampling,
                     seed=seed)
    tokens = steps = 0
    seconds = 0.0
    for i, prompt in enumerate(prompts):
        began = time.perf_counter()
        result = specdec.generate(target, prompt, drafter=drafter(), num_draft_tokens=k if make else 0,
                                  max_new_tokens=new_tokens, sampling=sampling, seed=seed + i)
        seconds += time.perf_counter() - began
        tokens += result.stats.new_tokens
        steps += result.stats.steps
    return tokens / steps, tokens / seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    family = parser.add_mutually_exclusive_group()
    family.add_argument("--quick", action="store_true", help="the quick zoo (built here in under a minute)")
    family.add_argument("--hybrid", action="store_true", help="the hybrid family (a Qwen3.5-layout target)")
    parser.add_argument("--cache-dir", default=None, help="zoo cache directory (default: the user cache)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32, 64], help="tree sizes N")
    parser.add_argument("--top-k", type=int, default=8, help="most ids per depth (default 8)")
    parser.add_argument("--prompts-per-category", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=None, help="default: the family's")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    settings = zoo.QUICK if args.quick else zoo.HYBRID if args.hybrid else zoo.FULL
    directory = zoo.ready(settings, root=args.cache_dir, show_progress=False)
    evaluation = read_evaluation(directory)
    tokenizer = load_tokenizer(directory / "tokenizer")
    prompts = [torch.tensor(tokenizer(p.text, add_special_tokens=False)["input_ids"])
               for p in first_per_category(evaluation.prompts, args.prompts_per_category)]
    target = specdec.CausalLM(load_causal_lm(directory / "target").eval())
    name, options = zoo.zoo_drafters(directory)["dflash"]
    k = zoo.draft_length("dflash", evaluation.k)
    new_tokens = args.new_tokens or evaluation.new_tokens
    sampling, seed = evaluation.sampling, evaluation.seed
    rows = [("plain", None), ("dflash chain", lambda: specdec.make_drafter(name, **options))]
    rows += [(f"ddtree N={n}", lambda n=n: specdec.make_drafter(name, **options, tree=True, top_k=args.top_k,
                                                                   total_tokens=n)) for n in args.budgets]
    print(f"{settings.name} family, {len(prompts)} held-out prompts, {new_tokens} new tokens, k = {k}, "
          f"temperature {evaluation.temperature:g}, top_k {args.top_k}, eager, {torch.get_num_threads()} threads")
    print(f"{'row':<16} {'mean acc. len':>14} {'tokens/s':>9} {'speedup':>8}")
    plain_rate = None
    for label, make in rows:
        length, rate = decode_all(target, prompts, make, k, new_tokens, sampling, seed)
        plain_rate = plain_rate or rate
        print(f"{label:<16} {length:>14.2f} {rate:>9.1f} {rate / plain_rate:>7.2f}x", flush=True)


if __name__ == "__main__":
    main()
