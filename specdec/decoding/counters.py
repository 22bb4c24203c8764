"""A generation's running counts, kept by the decode loop and turned into `Stats` at the end."""

from __future__ import annotations

from specdec.types import Stats

__all__ = ["Counters"]


class Counters:
    """Steps, drafted and accepted tokens (in all, per draft position and per step), and seconds."""

    def __init__(self, k: int) -> None:
        self.steps = self.drafted = self.accepted = 0
        self.drafted_at = [0] * k
        self.accepted_at = [0] * k
        self.accepted_by_step: list[int] = []
        self.draft_seconds = self.verify_seconds = 0.0

    def step(self, drafted: int, reached: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """Count one verify: `drafted` tokens (tree nodes) reaching depth `reached`, `accepted` of them."""
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.accepted_by_step.append(accepted)
        for i in range(reached):
            self.drafted_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1
        self.draft_seconds += draft_seconds
        self.verify_seconds += verify_seconds

    def stats(self, new_tokens: int, prefill_seconds: float, wall_seconds: float) -> Stats:
        return Stats(steps=self.steps, new_tokens=new_tokens, drafted=self.drafted, accepted=self.accepted,
                     accepted_per_position=tuple(self.accepted_at), drafted_per_position=tuple(self.drafted_at),
                     accepted_per_step=tuple(self.accepted_by_step),
                     prefill_seconds=prefill_seconds, draft_seconds=self.draft_seconds,
                     verify_seconds=self.verify_seconds, wall_seconds=wall_seconds)
