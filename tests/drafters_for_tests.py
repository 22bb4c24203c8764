"""Test-only drafters that stress the verifier: honest random q, and deterministic garbage.

Both draw from their own `torch.Generator` seeded from `seed`, never from `ctx.generator`, so
the verifier's random stream is the same as without them and a run is reproducible.
"""

from __future__ import annotations

from typing import ClassVar

import torch

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
