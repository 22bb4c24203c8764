"""Degenerate loops in generated text, and how much of a drafter's accepted length they gave.

A weak language model decoded greedily falls into loops ("is a file is a file is a file"), and
a loop is the easiest text there is to draft: an n-gram drafter copies it and a learned drafter
predicts it. A drafter's accepted length on looping text says little about its accepted length
on text worth reading, so specdec's figures say how much of it came from loops.

A generated token is a *loop token* when it lies inside an n-gram of the output that already
occurred earlier in the output (`LOOP_NGRAM` tokens; the prompt does not count, so copying a
name from the prompt is not a loop). An output is *degenerate* when its loop tokens are at
least `DEGENERATE_SHARE` of it: a repeated n-gram covers most of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DEGENERATE_SHARE", "LOOP_NGRAM", "LoopCount", "loop_count", "loop_mask"]

LOOP_NGRAM = 8  # about 25 characters of code under the zoo's tokenizer
DEGENERATE_SHARE = 0.5


def loop_mask(tokens: Sequence[int], n: int = LOOP_NGRAM) -> list[bool]:
    """mask[i]: whether tokens[i] lies in an n-gram of `tokens` that occurred, whole, at an
    earlier start (overlapping occurrences count: a period shorter than n repeats too)."""
    if n < 1:
        raise ValueError(f"a loop n-gram needs n >= 1, got {n}")
    mask = [False] * len(tokens)
    seen: set[tuple[int, ...]] = set()
    for start in range(len(tokens) - n + 1):
        gram = tuple(tokens[start : start + n])
        if gram in seen:
            for i in range(start, start + n):
                mask[i] = True
        else:
            seen.add(gram)
    return mask


@dataclass(frozen=True)
class LoopCount:
    """One generation laid against its loops.

    tokens: the tokens generated; loop_tokens: those in a loop (`loop_mask`).
    accepted: draft tokens the verifier accepted; loop_accepted: those of them that are loop tokens.
    """

    tokens: int
    loop_tokens: int
    accepted: int
    loop_accepted: int

    @property
    def share(self) -> float:
        """The output's loop tokens over its tokens."""
        return self.loop_tokens / self.tokens if self.tokens else 0.0

    @property
    def degenerate(self) -> bool:
        return self.tokens > 0 and self.share >= DEGENERATE_SHARE


def loop_count(tokens: Sequence[int], accepted_per_step: Sequence[int], n: int = LOOP_NGRAM) -> LoopCount:
    """Which of a generation's accepted draft tokens were loop tokens.

    Verify step s emitted its `accepted_per_step[s]` accepted draft tokens, then the target's
    own token (the correction or bonus), so the steps lay out the output from its start; an EOS
    may end the last step early.
    """
    mask = loop_mask(tokens, n)
    position = accepted = loop_accepted = 0
    for count in accepted_per_step:
        taken = min(count, len(tokens) - position)
        accepted += taken
        loop_accepted += sum(mask[position : position + taken])
        position += count + 1
    if position < len(tokens):
        raise ValueError(f"the steps lay out {position} tokens, fewer than the {len(tokens)} generated")
    return LoopCount(len(tokens), sum(mask), accepted, loop_accepted)
