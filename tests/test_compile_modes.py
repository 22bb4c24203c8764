"""`python -m specdec.bench.compile_modes`, the measurement behind docs/engine.md's choice of whole
graphs: its eager baseline runs the zoo-shaped target, and a mode it does not know is named."""

from __future__ import annotations

import pytest

from specdec.bench import compile_modes


def test_the_eager_baseline_times_forwards_of_the_zoo_shaped_target() -> None:
    first, per_forward = compile_modes.measure("eager", forwards=3)
    assert first > 0 and per_forward > 0


def test_an_unknown_mode_is_named_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert compile_modes.main(["eager", "regional"]) == 2
    error = capsys.readouterr().err
    assert "'regional'" in error and all(mode in error for mode in compile_modes.MODES)
