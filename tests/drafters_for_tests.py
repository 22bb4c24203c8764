"""Test-only drafters that stress the verifier: honest random q, and deterministic garbage.

Both draw from their own `torch.Generator` seeded from `seed`, never from `ctx.generator`, so
the verifier's random stream is the same as without them and a run is reproducible.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from specdec.protocols import row_view
from specdec.protocols import DraftContext
from specdec.types import Draft

__all__ = ["GarbageDrafter", "RandomQDrafter"]


def _generator(seed: int) -> torch.Generator:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


class RandomQDrafter:
    """Adversarial sampled drafter: each draft token is drawn from a fresh random q it reports.

    q is a peaked softmax of Gaussian logits with a random subset of the vocabulary zeroed
    (at least one token kept), so q puts mass where p has none and misses tokens p likes.
    """

    name: ClassVar[str] = "random-q"

    def __init__(self, seed: int = 0, zero_fraction: float = 0.3, scale: float = 2.0) -> None:
        if not 0.0 <= zero_fraction < 1.0:
            raise ValueError(f"random-q: zero_fraction must lie in [0, 1), got {zero_fraction!r}")
        self.generator = _generator(seed)
        self.zero_fraction = zero_fraction
        self.scale = scale

    def random_q(self, k: int, vocab_size: int) -> torch.Tensor:
        """k random distributions [k, V] in float64, each with at least one nonzero entry."""
        logits = self.scale * torch.randn(k, vocab_size, generator=self.generator, dtype=torch.float64)
        zeroed = torch.rand(k, vocab_size, generator=self.generator) < self.zero_fraction  # (k, V)
        zeroed[torch.arange(k), logits.argmax(dim=-1)] = False  # keep each row's top token
        return logits.masked_fill(zeroed, float("-inf")).softmax(dim=-1)  # (k, V)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        q = self.random_q(k, ctx.vocab_size)  # (k, V)
        tokens = torch.multinomial(q, 1, generator=self.generator).squeeze(-1) if k else q.new_zeros(0).long()
        return Draft(tokens.to(ctx.target.device), q.to(ctx.target.device))


class GarbageDrafter:
    """Deterministic drafter proposing k uniformly random ids, with no q (one-hot)."""

    name: ClassVar[str] = "garbage"

    def __init__(self, seed: int = 0) -> None:
        self.generator = _generator(seed)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        tokens = torch.randint(0, ctx.vocab_size, (k,), generator=self.generator)  # (k,)
        return Draft(tokens.to(ctx.target.device))


# --- tree drafters ----------------------------------------------------------------------------------

class TreeRecorder:
    """Keeps each tree draft and, at commit, the nodes the loop reports accepted (ctx.accepted)
    with the tokens actually committed, so tests can check the mapping back to node indices."""

    def __init__(self) -> None:
        self.drafts: list[Draft] = []  # across generations
        self.commits: list[tuple[Draft, tuple[int, ...], list[int]]] = []  # (draft, ctx.accepted, new tokens)
        self._length = 0

    def _record(self, ctx: DraftContext, draft: Draft) -> Draft:
        self._length = int(ctx.tokens.shape[0])
        self.drafts.append(draft)
        return draft

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        committed = ctx.tokens[self._length : self._length + num_accepted].tolist()
        self.commits.append((self.drafts[-1], tuple(ctx.accepted), committed))


class RandomTreeDrafter(TreeRecorder):
    """Adversarial tree drafter: random shapes (chains, wide fans, full b-ary trees, random
    bushes in random topological order) of random tokens, at most k deep.

    sampled=False: deterministic candidates (no probs), uniformly random ids (duplicates happen).
    sampled=True: each node drawn from a random q it reports; with shared_rows the children of
    one parent are i.i.d. draws from one row, so on a small vocabulary duplicates are frequent.
    """

    name: ClassVar[str] = "random-tree"

    def __init__(self, seed: int = 0, sampled: bool = False, shared_rows: bool = True, branching: int = 3,
                 max_nodes: int = 12, zero_fraction: float = 0.3, scale: float = 2.0) -> None:
        super().__init__()
        self.generator = _generator(seed)
        self.sampled, self.shared_rows = sampled, shared_rows
        self.branching, self.max_nodes = branching, max_nodes
        self.rows = RandomQDrafter(seed + 1, zero_fraction=zero_fraction, scale=scale)

    def max_draft_nodes(self, k: int) -> int:
        return max(k, self.max_nodes, 2 * self.branching)  # the longest chain, bush, b-ary tree or fan

    def _integer(self, low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=self.generator))

    def shape(self, k: int) -> list[int]:
        style = self._integer(0, 3)
        if style == 0:  # a chain k deep
            return list(range(-1, k - 1))
        if style == 1:  # a wide fan
            return [-1] * self._integer(1, 2 * self.branching)
        parents: list[int] = []
        depth: list[int] = []
        if style == 2:  # full b-ary, breadth first
            frontier = [-1]
            for _ in range(k):
                next_frontier = []
                for parent in frontier:
                    for _ in range(self.branching):
                        if len(parents) < self.max_nodes:
                            parents.append(parent)
                            next_frontier.append(len(parents) - 1)
                frontier = next_frontier
            return parents
        for i in range(self._integer(1, self.max_nodes)):  # a random bush
            options = [-1] + [j for j in range(i) if depth[j] < k]
            parent = options[self._integer(0, len(options) - 1)]
            parents.append(parent)
            depth.append(1 if parent < 0 else depth[parent] + 1)
        return parents

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        parents = self.shape(k) if k else []
        n = len(parents)
        vocab = ctx.vocab_size
        probs = None
        if not self.sampled:
            tokens = torch.randint(0, vocab, (n,), generator=self.generator)
        else:
            rows = self.rows.random_q(n + 1, vocab)  # (n + 1, V): row 0 for the root's children
            if self.shared_rows:  # siblings share their parent's row
                probs = rows[[parent + 1 for parent in parents]] if n else rows[:0]
            else:
                probs = rows[1:]
            tokens = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1) if n else rows.new_zeros(0).long()
        device = ctx.target.device
        draft = Draft(tokens.to(device), None if probs is None else probs.to(device),
                      torch.tensor(parents, dtype=torch.long, device=device))
        return self._record(ctx, draft)


class OracleTreeDrafter(TreeRecorder):
    """Deterministic tree holding the true continuation `reference[len(ctx.tokens):]` as one
    branch among random ones (first=True: along the first children, what a chain fallback
    verifies); reference is the prompt followed by the greedy output."""

    name: ClassVar[str] = "oracle-tree"

    def __init__(self, reference: list[int], seed: int = 0, branches: int = 3, first: bool = False) -> None:
        super().__init__()
        self.reference = list(reference)
        self.generator = _generator(seed)
        self.branches, self.first = branches, first

    def max_draft_nodes(self, k: int) -> int:
        return (self.branches + 1) * k  # the truth and the garbage branches, k deep

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        from specdec.trees import tree_from_paths

        start = int(ctx.tokens.shape[0])
        truth = self.reference[start : start + k]
        paths: list[list[int]] = []
        for _ in range(self.branches):  # garbage branches, some sharing a prefix of the truth
            shared = int(torch.randint(0, len(truth) + 1, (1,), generator=self.generator)) if truth else 0
            length = int(torch.randint(shared, k + 1, (1,), generator=self.generator))
            noise = torch.randint(0, ctx.vocab_size, (max(length - shared, 0),), generator=self.generator).tolist()
            if length > shared:
                paths.append(truth[:shared] + noise)
        slot = 0 if self.first else int(torch.randint(0, len(paths) + 1, (1,), generator=self.generator))
        paths.insert(slot, truth)
        tokens, parents = tree_from_paths([path for path in paths if path])
        device = ctx.target.device
        draft = Draft(torch.tensor(tokens, dtype=torch.long, device=device), None,
                      torch.tensor(parents, dtype=torch.long, device=device))
        return self._record(ctx, draft)


class TopKTreeDrafter(TreeRecorder):
    """Deterministic top-b tree from a draft model (no cache): the b most likely next tokens at
    the root, then at each of them, ..., up to k deep and `max_nodes` nodes; no probs."""

    name: ClassVar[str] = "topk-tree"

    def __init__(self, model: torch.nn.Module, branching: int = 2, max_nodes: int = 14) -> None:
        super().__init__()
        self.model, self.branching, self.max_nodes = model, branching, max_nodes

    def max_draft_nodes(self, k: int) -> int:
        return self.max_nodes

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        tokens: list[int] = []
        parents: list[int] = []
        frontier: list[tuple[int, list[int]]] = [(-1, [])]  # (node, tokens from the root)
        for _ in range(k):
            room = self.max_nodes - len(tokens)
            if not frontier or room <= 0:
                break
            prefix = ctx.tokens.tolist()
            ids = torch.tensor([prefix + path for _, path in frontier], device=ctx.target.device)  # (F, T + d)
            logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1]  # (F, V)
            top = torch.topk(logits, self.branching, dim=-1).indices.tolist()  # (F, b)
            next_frontier = []
            for (node, path), candidates in zip(frontier, top):
                for token in candidates:
                    if len(tokens) < self.max_nodes:
                        tokens.append(token)
                        parents.append(node)
                        next_frontier.append((len(tokens) - 1, path + [token]))
            frontier = next_frontier
        device = ctx.target.device
        draft = Draft(torch.tensor(tokens, dtype=torch.long, device=device), None,
                      torch.tensor(parents, dtype=torch.long, device=device))
        return self._record(ctx, draft)


class ChainAsTree:
    """Wraps a chain drafter: the same tokens and q, with parents [-1, 0, 1, ...]."""

    def __init__(self, inner: object) -> None:
        self.inner = row_view(inner)
        self.name = f"{getattr(inner, 'name', type(inner).__name__)}-as-tree"

    def prefill(self, ctx: DraftContext) -> None:
        if hasattr(self.inner, "prefill"):
            self.inner.prefill(ctx)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        draft = self.inner.propose(ctx, k)  # type: ignore[attr-defined]
        n = draft.tokens.shape[0]
        return Draft(draft.tokens, draft.probs, torch.arange(-1, n - 1, device=draft.tokens.device))

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        if hasattr(self.inner, "commit"):
            self.inner.commit(ctx, num_accepted)


__all__ += ["ChainAsTree", "OracleTreeDrafter", "RandomTreeDrafter", "TopKTreeDrafter", "TreeRecorder"]
