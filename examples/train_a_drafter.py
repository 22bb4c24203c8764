"""Train an EAGLE head (or any drafter kind) for the zoo's target on a few files of your own,
the same code `specdec train` runs, then decode with it.

    python examples/train_a_drafter.py --kind eagle --data path/to/texts --out my-eagle
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import specdec
from specdec import zoo
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.data.corpus import stdlib_corpus
from specdec.training.optim import Steps
from specdec.training.run import KINDS, TrainSettings, train_drafter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=KINDS, default="eagle")
    parser.add_argument("--data", nargs="+", default=None, help="default: 40 standard-library files")
    parser.add_argument("--out", default=None, help="default: a temporary directory")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="the quick zoo")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)

    target = zoo.ready(zoo.QUICK if args.quick else zoo.FULL, root=args.cache_dir) / "target"
    data = args.data or [str(p) for p in stdlib_corpus().train[:40]]
    out = Path(args.out or tempfile.mkdtemp(prefix="specdec-")) / args.kind
    settings = TrainSettings(steps=Steps(steps=args.steps, batch=4, seq_len=128, lr=1e-3))
    report = train_drafter(args.kind, target, data, out, settings)
    print(f"{args.kind}: held-out agreement {report.heldout['agreement']:.2f}, mean accepted length "
          f"{report.mean_accepted_length:.2f} (greedy, k = 4), saved to {report.out}")

    model, tokenizer = load_causal_lm(target), load_tokenizer(target)
    option = "model" if args.kind == "draft-model" else "path"
    drafter = specdec.make_drafter(args.kind, **{option: str(out)})
    prompt = tokenizer("def read_lines(path):\n", add_special_tokens=False)["input_ids"]
    result = specdec.generate(model, prompt, drafter=drafter, max_new_tokens=32)
    print(tokenizer.decode(prompt + result.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
