"""Ask the target, in ONE forward, what it thinks of a continuation: which tokens the greedy
verifier would accept, the correction where it first disagrees, and its top-5 at each position.

    python examples/verify_probe.py
    python examples/verify_probe.py --prefix "def area(r):\n" --continuation "    return 3.14 * r * r\n"
"""

from __future__ import annotations

import argparse
import sys

from specdec import zoo
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.teaching.probe import probe
from specdec.teaching.probe_view import probe_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", default='class Stack:\n    """A stack of items."""\n\n    def push(self, item):\n')
    parser.add_argument("--continuation", default="        self.items.append(item)\n")
    parser.add_argument("--quick", action="store_true", help="the quick zoo")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)
    unescape = lambda text: text.encode().decode("unicode_escape")  # noqa: E731  ("\n" typed in a shell)

    directory = zoo.ready(zoo.QUICK if args.quick else zoo.FULL, root=args.cache_dir)
    tokenizer, model = load_tokenizer(directory / "target"), load_causal_lm(directory / "target")
    encode = lambda text: tokenizer(unescape(text), add_special_tokens=False)["input_ids"]  # noqa: E731
    result = probe(model, encode(args.prefix), encode(args.continuation))
    print(unescape(args.prefix), end="")
    print(probe_text(result, tokenizer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
