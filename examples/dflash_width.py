"""What a DFlash slot reads of its context on the zoo: a DFlash drafter trained for the full family's
target with the target's attention heads (two query heads sharing one key/value head) or with
`--heads N` heads of their own keys and values, and its held-out figures per slot beside the
family's EAGLE-3 and draft model (`docs/drafters.md`, DFlash on the zoo).

    .venv/bin/python examples/dflash_width.py [--heads 4] [--steps 600] [--layers 2] [--quick]

The context reaches DFlash's block only as the keys and values each layer projects from the fused
target features; the first slot's top-1 agreement with the target measures how much of it the block
reads. Training follows the zoo's DFlash recipe (`specdec.zoo.parallel`): the family's training text,
its students' batch, windows and learning rate, 64 anchors per window, five fused target layers.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

from specdec import zoo
from specdec.checkpoints import load_causal_lm, load_tokenizer, quiet_transformers
from specdec.data.corpus import stdlib_corpus
from specdec.training.data import encode_corpus, evaluation_windows
from specdec.training.dflash import DFlashStudent, training_layer_ids
from specdec.training.distill import distill, evaluate
from specdec.zoo.parallel import DFLASH_ANCHORS, DFLASH_FUSED, dflash_steps
from specdec.zoo.settings import DFLASH_BLOCK


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the quick zoo (built here in under a minute)")
    parser.add_argument("--cache-dir", default=None, help="zoo cache directory (default: the user cache)")
    parser.add_argument("--heads", type=int, default=None, help="attention heads with their own keys and values "
                        "(default: the target's)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    settings = zoo.QUICK if args.quick else zoo.FULL
    family = zoo.ready(settings, root=args.cache_dir, show_progress=False)
    with quiet_transformers():
        target = load_causal_lm(family / "target").eval()
    tokenizer = load_tokenizer(family / "tokenizer")
    data = encode_corpus(tokenizer, stdlib_corpus(), int(tokenizer.eos_token_id), settings.train_chars,
                         settings.heldout_chars)
    steps = replace(dflash_steps(settings), steps=args.steps)
    fused = training_layer_ids(int(target.config.num_hidden_layers), DFLASH_FUSED)
    student = DFlashStudent.create(target, steps.seed, lr=steps.lr, tokenizer=tokenizer, block_size=DFLASH_BLOCK,
                                   layers=args.layers, target_layer_ids=fused, anchors=DFLASH_ANCHORS,
                                   heads=args.heads)
    attention = student.module.layers[0].self_attn
    began = time.perf_counter()
    distill(target, [student], data.train, steps, show_progress=False)
    windows = evaluation_windows(data.heldout, settings.student_steps.seq_len, settings.eval_windows)
    figures = evaluate(target, [student], windows)["dflash"]
    shipped = json.loads((family / "figures.json").read_text())["losses"]
    print(f"dflash: {args.layers} layers, {attention.heads} query heads over {attention.kv_heads} key/value "
          f"head(s) of {attention.head_dim}, {sum(p.numel() for p in student.module.parameters())} parameters, "
          f"{args.steps} steps in {time.perf_counter() - began:.0f} s")
    print("held-out: " + ", ".join(f"{name} {value:.3f}" for name, value in figures.items()))
    for name in ("eagle3", "draft-model"):
        if name in shipped:
            print(f"{name} (shipped): loss {shipped[name]['loss']:.3f}, agreement {shipped[name]['agreement']:.3f}")


if __name__ == "__main__":
    main()
