"""The `make demo` program: its quick run prints a consistent comparison table."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

import pytest

DEMO_PATH = Path(__file__).resolve().parents[1] / "examples" / "demo.py"
NEW_TOKENS = 24
K = 3


def _load_demo():
    spec = importlib.util.spec_from_file_location("specdec_demo", DEMO_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


demo = _load_demo()


def _table_rows(output: str) -> list[dict[str, str]]:
    """The printed table's rows as dicts keyed by its header (cells are split on 2+ spaces)."""
    lines = output.splitlines()
    split = lambda line: [cell.strip() for cell in line.split("  ") if cell.strip()]  # noqa: E731
    starts = [i for i, line in enumerate(lines) if tuple(split(line)) == demo.HEADER]
    assert len(starts) == 1, f"expected one table header {demo.HEADER} in the output:\n{output}"
    header = split(lines[starts[0]])
    assert set(lines[starts[0] + 1]) == {"-", " "}, "no rule under the table header"
    rows = []
    for line in lines[starts[0] + 2 :]:
        if not line.strip():
            break
        cells = split(line)
        assert len(cells) == len(header), f"malformed table row {line!r}"
        rows.append(dict(zip(header, cells)))
    return rows


@pytest.fixture(scope="module")
def quick_table() -> tuple[int, list[dict[str, str]], str]:
    """One quick demo run (module-scoped, so capsys cannot be used): exit code, rows, output."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = demo.main(["--quick", "--new-tokens", str(NEW_TOKENS), "--k", str(K), "--threads", "1"])
    output = buffer.getvalue()
    return code, _table_rows(output), output


def test_quick_run_succeeds_and_lists_every_drafter_greedy_and_sampled(quick_table):
    code, rows, _ = quick_table
    assert code == 0
    assert [(r["drafter"], r["sampling"]) for r in rows] == [
        (drafter, sampling) for sampling in ("greedy", "T=0.8") for drafter in ("plain", "ngram", "draft-model")
    ]
    assert all(int(r["new tokens"]) == NEW_TOKENS for r in rows)


def test_greedy_speculative_rows_reproduce_plain_greedy_tokens(quick_table):
    _, rows, _ = quick_table
    assert {r["drafter"]: r["same as plain"] for r in rows if r["sampling"] == "greedy"} == {
        "plain": "yes", "ngram": "yes", "draft-model": "yes"}
    assert {r["same as plain"] for r in rows if r["sampling"] != "greedy"} == {"n/a"}


def test_plain_rows_take_one_target_forward_per_token(quick_table):
    _, rows, _ = quick_table
    for row in (r for r in rows if r["drafter"] == "plain"):
        assert int(row["target forwards"]) == NEW_TOKENS, row
        assert (row["mean acc. len"], row["acceptance"], row["speedup"]) == ("1.00", "-", "1.00x"), row


def test_speculative_rows_are_consistent_counters(quick_table):
    _, rows, _ = quick_table
    for row in (r for r in rows if r["drafter"] != "plain"):
        steps, new = int(row["target forwards"]), int(row["new tokens"])
        assert new / (K + 1) <= steps <= new, row  # each forward emits 1..k+1 tokens
        assert row["mean acc. len"] == f"{new / steps:.2f}", row
        assert 0 <= int(row["acceptance"].rstrip("%")) <= 100, row
        assert float(row["tokens/s"]) > 0 and float(row["speedup"].rstrip("x")) > 0, row


def test_output_shows_prompt_and_continuations(quick_table):
    _, _, output = quick_table
    prompt = bytes(demo.prompt_ids(demo.QUICK.prompt_bytes).tolist()).decode()
    assert prompt in output
    assert "--- greedy continuation" in output and "--- T=0.8 continuation" in output


def test_prompt_is_held_out_of_the_training_text():
    prompt = bytes(demo.prompt_ids(demo.DEFAULT.prompt_bytes).tolist())
    training = bytes(demo.training_ids().tolist())
    assert len(prompt) > 40
    assert prompt not in training
