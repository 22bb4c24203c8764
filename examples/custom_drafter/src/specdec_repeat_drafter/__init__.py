"""specdec plugin "repeat-drafter": registers the `repeat` drafter through the specdec hook."""

from __future__ import annotations

import specdec
from specdec_repeat_drafter.drafter import RepeatDrafter, find_period

__all__ = ["RepeatDrafter", "find_period", "specdec_register_drafters"]


@specdec.hookimpl
def specdec_register_drafters() -> list[type]:
    return [RepeatDrafter]
