"""What each verification rule costs per verify step, given the target's rows: the chain rules on
k draft tokens (token-wise `chain_verdict`, block `block_verdict`) and the tree rules on a sampled
tree (the sibling rule `verify_tree`, traversal `verify_traversal`), at each vocabulary size.

    .venv/bin/python examples/verify_rule_cost.py [--vocab 2048 49152] [--k 4] [--nodes 16]

p and q are softmaxes of random logits (q a tempered p, so drafts are often kept and the walks go
deep); a chain's draft is drawn from q, a tree's siblings i.i.d. from q at each node (top_k 4 per
node, breadth first, `--nodes` nodes). The tree rules get p as a row function that takes one
softmax per row asked, as the loop's lazy rows do, and the rows each walk asked for are counted.
One thread; each figure is the median of --repeats timed verdicts. The rules' gains in accepted
tokens are measured by `specdec bench --verify-rule` (`docs/verification.md`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.verifier import block_verdict, chain_verdict, verify_traversal, verify_tree


def chain_seconds(verdict: object, vocab: int, k: int, repeats: int) -> float:
    generator = torch.Generator().manual_seed(0)
    times = []
    for _ in range(repeats):
        logits = torch.randn(k + 1, vocab, generator=generator)
        p = torch.softmax(logits, -1)
        q = torch.softmax(logits[:k] * 0.8 + 0.3 * torch.randn(k, vocab, generator=generator), -1)
        tokens = torch.multinomial(q, 1, generator=generator).squeeze(-1)
        tick = time.perf_counter()
        verdict(p, tokens, q, generator)  # type: ignore[operator]
        times.append(time.perf_counter() - tick)
    return statistics.median(times)


def sampled_tree(q: torch.Tensor, nodes: int, top_k: int, generator: torch.Generator) -> tuple[torch.Tensor, list[int]]:
    """A breadth-first tree of `nodes` nodes, top_k i.i.d. children per node, drawn from q rows [nodes + 1, V]."""
    parents: list[int] = []
    tokens: list[int] = []
    frontier = [-1]
    while len(parents) < nodes:
        parent = frontier.pop(0)
        for _ in range(min(top_k, nodes - len(parents))):
            tokens.append(int(torch.multinomial(q[parent + 1], 1, generator=generator)))
            parents.append(parent)
            frontier.append(len(parents) - 1)
    return torch.tensor(tokens), parents


def tree_seconds(verify: object, vocab: int, nodes: int, repeats: int) -> tuple[float, float]:
    """(median seconds, mean rows asked) of one tree verdict."""
    generator = torch.Generator().manual_seed(0)
    times, rows = [], []
    for _ in range(repeats):
        logits = torch.randn(nodes + 1, vocab, generator=generator)
        q_rows = torch.softmax(logits * 0.8 + 0.3 * torch.randn(nodes + 1, vocab, generator=generator), -1)
        tokens, parents = sampled_tree(q_rows, nodes, 4, generator)
        q = torch.stack([q_rows[parent + 1] for parent in parents])  # (n, V): each node's row, its parent's q
        asked = []

        def row(r: int) -> torch.Tensor:
            asked.append(r)
            return torch.softmax(logits[r], -1)

        tick = time.perf_counter()
        verify(row, tokens, parents, q, generator)  # type: ignore[operator]
        times.append(time.perf_counter() - tick)
        rows.append(len(asked))
    return statistics.median(times), statistics.fmean(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[2048, 49152])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    print(f"{'vocab':>6}  {'token':>9}  {'block':>9}  {'sibling':>9}  {'traversal':>9}  rows asked (sibling / traversal)")
    for vocab in args.vocab:
        token = chain_seconds(chain_verdict, vocab, args.k, args.repeats)
        block = chain_seconds(block_verdict, vocab, args.k, args.repeats)
        sibling, sibling_rows = tree_seconds(verify_tree, vocab, args.nodes, args.repeats)
        traversal, traversal_rows = tree_seconds(verify_traversal, vocab, args.nodes, args.repeats)
        print(f"{vocab:>6}  {1e6 * token:>7.0f}us  {1e6 * block:>7.0f}us  {1e6 * sibling:>7.0f}us  "
              f"{1e6 * traversal:>7.0f}us  {sibling_rows:.1f} / {traversal_rows:.1f}")
    torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
