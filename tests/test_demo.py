"""The `make demo` program on the quick zoo: a table of every drafter, consistent with itself,
after an estimate of the whole run and a first look."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import re
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from specdec import zoo

DEMO_PATH = Path(__file__).resolve().parents[1] / "examples" / "demo.py"
K = 4
NEW_TOKENS = 24  # the quick family's evaluation's


def _load_demo():
    spec = importlib.util.spec_from_file_location("specdec_demo", DEMO_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


demo = _load_demo()


def _table_rows(output: str, header: tuple[str, ...] = demo.HEADER) -> list[dict[str, str]]:
    """The printed table's rows as dicts keyed by its header (cells are split on 2+ spaces)."""
    lines = output.splitlines()
    split = lambda line: [cell.strip() for cell in line.split("  ") if cell.strip()]  # noqa: E731
    starts = [i for i, line in enumerate(lines) if tuple(split(line)) == header]
    assert len(starts) == 1, f"expected one table header {header} in the output:\n{output}"
    assert set(lines[starts[0] + 1]) == {"-", " "}, "no rule under the table header"
    rows = []
    for line in lines[starts[0] + 2 :]:
        if not line.strip():
            break
        cells = split(line)
        assert len(cells) == len(header), f"malformed table row {line!r}"
        rows.append(dict(zip(header, cells)))
    return rows


class Run(NamedTuple):
    code: int
    output: str
    before_full: str  # what was printed when the full evaluation began (`demo.compare` was called)
    decodes: int  # decodes of the evaluation's new tokens (a warm-up decodes fewer)


@pytest.fixture(scope="module")
def demo_run(quick_zoo: Path) -> Run:
    buffer = io.StringIO()
    printed: list[str] = []
    decodes: list[int] = []
    compare, decode_one = demo.compare, demo.decode_one

    def spy_compare(*args, **kwargs):
        printed.append(buffer.getvalue())
        return compare(*args, **kwargs)

    def spy_decode(*args, **kwargs):
        decodes.append(inspect.signature(decode_one).bind(*args, **kwargs).arguments["evaluation"].new_tokens)
        return decode_one(*args, **kwargs)

    # The family's own evaluation (3 prompts, 24 new tokens, temperature 0.5), decoded eagerly: the
    # table's logic is the demo's own; that the compiled engine gives every zoo drafter's eager tokens
    # is tests/test_engine_zoo.py's (compiling the demo's sampled rows and greedy check took 200 s).
    # A first look at one prompt, whose decodes the eager evaluation takes: it costs the warm-ups.
    with contextlib.redirect_stdout(buffer), pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo, "compare", spy_compare)
        patch.setattr(demo, "decode_one", spy_decode)
        code = demo.main(["--quick", "--family", "main", "--cache-dir", str(quick_zoo.parent), "--k", str(K),
                          "--repeats", "1", "--no-progress", "--eager", "--first-look", "1"])
    assert len(printed) == 1, "the full evaluation did not run once"
    return Run(code, buffer.getvalue(), printed[0], decodes.count(NEW_TOKENS))


@pytest.fixture(scope="module")
def quick_run(demo_run: Run) -> tuple[int, list[dict[str, str]], str]:
    return demo_run.code, _table_rows(demo_run.output), demo_run.output


def _interval(cell: str) -> tuple[float, float, float]:
    estimate, low, high = cell.replace("[", "").replace("]", "").replace(",", "").replace("x", "").split()
    return float(estimate), float(low), float(high)


def test_the_table_lists_plain_decoding_and_every_drafter(quick_run):
    code, rows, output = quick_run
    assert code == 0, output
    chains = ["ngram", "lookahead", "suffix", "retrieval", "draft-model", "medusa", "eagle", "eagle3", "mtp", "dflash"]
    assert [r["drafter"] for r in rows] == ["plain", *[label for name in chains for label in (name, f"{name}+tree")],
                                            "pard"]  # pard drafts chains only
    assert "3 held-out prompts (block, class, signature), temperature 0.5" in output


def test_every_drafter_reproduces_plain_greedy_decoding(quick_run):
    _, rows, _ = quick_run
    assert {r["lossless"] for r in rows} == {"yes"}


def test_figures_are_consistent_and_ranks_follow_the_intervals(quick_run):
    _, rows, _ = quick_run
    plain = rows[0]
    assert _interval(plain["mean acc. len [95%]"]) == (1.0, 1.0, 1.0)  # one forward per token
    assert (plain["acceptance"], plain["speedup [95%]"], plain["acc. rank"]) == ("-", "1.00x", "-")
    for row in rows[1:]:
        estimate, low, high = _interval(row["mean acc. len [95%]"])
        assert 1.0 <= low <= estimate <= high <= zoo.draft_length(row["drafter"].removesuffix("+tree"), K) + 1, row
        assert 0 <= float(row["from loops"]) <= estimate - 1 + 1e-9, row
        assert 0 <= int(row["acceptance"].rstrip("%")) <= 100, row
        speedup = _interval(row["speedup [95%]"])
        assert 0 < speedup[1] <= speedup[0] <= speedup[2], row
    ranked = {row["drafter"]: int(row["acc. rank"].lstrip("=")) for row in rows[1:]}
    estimates = {row["drafter"]: _interval(row["mean acc. len [95%]"])[0] for row in rows[1:]}
    for a in ranked:  # a rank never puts a drafter below one whose estimate is lower
        for b in ranked:
            if ranked[a] < ranked[b]:
                assert estimates[a] > estimates[b], (a, b)


def test_the_demo_prints_the_family_figures(quick_run, quick_zoo: Path):
    """Decoding the family's own evaluation, every chain's accepted length is the one the build
    measured (eagerly, at build time) and `specdec zoo info` and the docs publish."""
    from specdec import zoo

    _, rows, _ = quick_run
    figures = zoo.read_figures(quick_zoo)["drafters"]
    for row in rows[1:]:
        if "+" not in row["drafter"]:
            published = figures[row["drafter"]]["mean_accepted_length"]
            assert row["mean acc. len [95%]"] == (f"{published['estimate']:.2f} [{published['low']:.2f}, "
                                                 f"{published['high']:.2f}]"), row


def test_output_names_the_zoo_and_shows_a_held_out_prompt(quick_run, quick_zoo: Path):
    _, _, output = quick_run
    assert str(quick_zoo) in output and "held-out loss" in output
    assert "Held-out prompt" in output and "in loops" in output


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


def test_a_first_look_at_every_drafter_is_printed_before_the_full_evaluation_begins(demo_run, quick_run):
    before = demo_run.before_full
    first = _table_rows(before, demo.FIRST_LOOK_HEADER)
    assert [r["drafter"] for r in first] == [r["drafter"] for r in quick_run[1]]
    assert "First look: every drafter on 1 of the 3 held-out prompts (signature)" in before
    assert "lossless: the first" not in before  # the full table's title
    assert before.index("Held-out prompt") < before.index("First look:")  # the example is its first decode


def test_the_first_look_gives_the_family_figures_of_its_prompt(demo_run, quick_zoo: Path):
    """Its one prompt is the family's first: each chain's tokens per target forward and acceptance
    are that prompt's in the figures the build measured."""
    from specdec import zoo

    figures = zoo.read_figures(quick_zoo)["drafters"]
    for row in _table_rows(demo_run.before_full, demo.FIRST_LOOK_HEADER)[1:]:
        if "+" not in row["drafter"]:
            new_tokens, steps, drafted, accepted, *_ = figures[row["drafter"]]["prompts"][0]
            length = f"{new_tokens / steps:.2f}"
            assert row["mean acc. len [95%]"] == f"{length} [{length}, {length}]", row
            assert row["acceptance"] == f"{accepted / drafted:.0%}", row


def test_the_start_counts_the_decodes_the_run_makes(demo_run, quick_run):
    """Counted before any decode: the first look's, the greedy check's and the round's, less the
    round's decodes it takes from the first look (every row's but suffix's, which learns)."""
    before = demo_run.before_full
    line = next(line for line in before.splitlines() if line.startswith("The whole run: "))
    assert before.index(line) < before.index("held-out loss") < before.index("First look:")
    stated = re.match(r"The whole run: ([\d,]+) decodes of up to (\d+) new tokens, about \d+ minutes? ", line)
    assert stated, line
    assert (int(stated[1].replace(",", "")), int(stated[2])) == (demo_run.decodes, NEW_TOKENS), line
    rows = len(quick_run[1])
    assert demo_run.decodes == rows + rows * (3 + 3) - (rows - 2)  # first look, check and round, reused
    assert "The first look took " in before and "at that pace the rest takes about " in before
