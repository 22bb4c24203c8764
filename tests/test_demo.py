"""The `make demo` program on the quick zoo: a table of every drafter, consistent with itself."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

import pytest

DEMO_PATH = Path(__file__).resolve().parents[1] / "examples" / "demo.py"
NEW_TOKENS = 16
K = 4  # the k of tests/test_engine_zoo.py, which runs after this file in the same process and replays these graphs


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
    assert set(lines[starts[0] + 1]) == {"-", " "}, "no rule under the table header"
    rows = []
    for line in lines[starts[0] + 2 :]:
        if not line.strip():
            break
        cells = split(line)
        assert len(cells) == len(demo.HEADER), f"malformed table row {line!r}"
        rows.append(dict(zip(demo.HEADER, cells)))
    return rows


@pytest.fixture(scope="module")
def quick_run(quick_zoo: Path) -> tuple[int, list[dict[str, str]], str]:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = demo.main(["--quick", "--family", "main", "--cache-dir", str(quick_zoo.parent), "--prompts", "1", "--new-tokens",
                          str(NEW_TOKENS), "--k", str(K), "--repeats", "1", "--no-progress"])
    output = buffer.getvalue()
    return code, _table_rows(output), output


def test_the_table_lists_plain_decoding_and_every_drafter(quick_run):
    code, rows, output = quick_run
    assert code == 0, output
    chains = ["ngram", "lookahead", "suffix", "retrieval", "draft-model", "medusa", "eagle", "eagle3", "mtp"]
    assert [r["drafter"] for r in rows] == ["plain", *[label for name in chains for label in (name, f"{name}+tree")]]
    assert all(int(r["new tokens"]) == 3 * NEW_TOKENS for r in rows)  # three prompts, one per category


def test_every_drafter_reproduces_plain_greedy_decoding(quick_run):
    _, rows, _ = quick_run
    assert {r["same as plain"] for r in rows} == {"yes"}


def test_counters_are_consistent(quick_run):
    _, rows, _ = quick_run
    plain = rows[0]
    assert int(plain["target forwards"]) == 3 * NEW_TOKENS  # one forward per token
    assert (plain["acceptance"], plain["speedup"]) == ("-", "1.00x")
    for row in rows[1:]:
        steps, new = int(row["target forwards"]), int(row["new tokens"])
        assert new / (K + 1) <= steps <= new, row
        assert row["mean acc. len"] == f"{new / steps:.2f}", row
        assert 0 <= int(row["acceptance"].rstrip("%")) <= 100, row
        assert float(row["tokens/s"]) > 0 and float(row["speedup"].rstrip("x")) > 0, row


def test_output_names_the_zoo_and_shows_a_held_out_prompt(quick_run, quick_zoo: Path):
    _, _, output = quick_run
    assert str(quick_zoo) in output and "held-out loss" in output
    assert "Held-out prompt" in output


def test_a_draft_tax_line_per_drafter(quick_run):
    _, rows, output = quick_run
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Draft tax (one target forward: "))
    taxes = {line.split()[0]: line for line in lines[start + 1 : start + len(rows)]}
    assert list(taxes) == [r["drafter"] for r in rows[1:]]
    for label, line in taxes.items():
        forwards = float(line.split(" costs ")[1].split()[0])
        assert forwards > 0, line
        if label in ("draft-model", "eagle", "eagle3", "mtp"):  # k drafter forwards per draft
            ratio = float(line.split(" = ")[1].split()[0])
            assert ratio == pytest.approx(forwards / K, abs=2e-3), line
        elif "+" in label or label in ("ngram", "lookahead", "suffix", "retrieval"):
            assert "the whole draft" in line, line
