"""A trained drafter's acceptance on held-out prompts, measured the only way that counts: by
decoding greedily with it through `specdec.generate` and counting what the verifier accepted."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedModel

from specdec.decoding.generate import generate
from specdec.protocols import Drafter
from specdec.runtime.target import CausalLM
from specdec.types import Stats, total_stats

__all__ = ["acceptance_estimate", "prompt_windows"]


def acceptance_estimate(target: PreTrainedModel | CausalLM, make_drafter: Callable[[], Drafter],
                        prompts: Sequence[torch.Tensor], k: int = 4, max_new_tokens: int = 64) -> Stats:
    """The counters of greedy speculative decoding of every prompt, added up.

    `mean_accepted_length` (tokens per target forward, bonus included) and `acceptance_rate`
    of the result are the estimate; a fresh drafter serves each prompt.
    """
    if not prompts:
        raise ValueError("acceptance_estimate needs at least one prompt")
    lm = target if isinstance(target, CausalLM) else CausalLM(target)
    runs = [generate(lm, prompt, make_drafter(), num_draft_tokens=k, max_new_tokens=max_new_tokens).stats
            for prompt in prompts]
    return total_stats(runs)


def prompt_windows(heldout: torch.Tensor, count: int, length: int) -> list[torch.Tensor]:
    """`count` evenly spaced held-out snippets of `length` tokens, as prompts: LongTensor [length] each."""
    if heldout.shape[0] < length + 1:
        raise ValueError(f"the held-out text has {heldout.shape[0]} tokens, too few for a {length}-token prompt")
    starts = torch.linspace(0, heldout.shape[0] - length - 1, max(1, count)).long().tolist()
    return [heldout[s : s + length].clone() for s in starts]
