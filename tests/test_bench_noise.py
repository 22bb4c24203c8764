"""The bench on a busy machine: figures are medians over rounds with a robust spread, a row
whose timings spread past the bound is flagged noisy (table, JSON, CSV, plot), and the runner
gives such rows more rounds, up to a limit. Runs and timings are built by hand: nothing is timed."""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from specdec.bench.questions import Question
from specdec.bench.report import NOISE_BOUND, csv_text, noisy_contenders, summarize, table
from specdec.bench.runner import Contender, Run, repeat_rounds, run_bench
from specdec.types import Sampling, Stats

PLAIN, TIGHT, WIDE = Contender("plain"), Contender("tight", drafter="ngram", k=4), Contender("wide", drafter="ngram", k=2)
CONTENDERS = (PLAIN, TIGHT, WIDE)
QUESTIONS = (("q1", "code"), ("q2", "docs"))  # (id, category), one turn each
TOKENS = 64


def _run(label: str, question: tuple[str, str], repeat: int, seconds: float) -> Run:
    stats = Stats(steps=TOKENS // 2, new_tokens=TOKENS, drafted=TOKENS, accepted=TOKENS // 2,
                  accepted_per_position=(16, 16), drafted_per_position=(32, 32), draft_seconds=seconds / 4,
                  verify_seconds=seconds / 2, wall_seconds=seconds)
    return Run(label, question[0], question[1], 0, repeat, stats, [1] * TOKENS)


def _rounds(seconds: dict[str, Sequence[float]]) -> list[Run]:
    """Every question of round i takes seconds[label][i] for each contender."""
    return [_run(label, question, i, per_round[i]) for label, per_round in seconds.items()
            for i in range(len(per_round)) for question in QUESTIONS]


PLAIN_SECONDS = [1.0, 1.0, 1.0, 1.0, 1.0]
TIGHT_SECONDS = [0.50, 0.51, 0.49, 0.50, 0.52]
WIDE_SECONDS = [0.20, 0.90, 0.50, 0.25, 0.70]  # another job on the cores


@pytest.fixture
def records() -> list[dict]:
    runs = _rounds({"plain": PLAIN_SECONDS, "tight": TIGHT_SECONDS, "wide": WIDE_SECONDS})
    return summarize(runs, CONTENDERS, None, greedy=True)


def _all(records: list[dict]) -> dict[str, dict]:
    return {r["contender"]: r for r in records if r["category"] == "all"}


def test_the_widely_spread_row_is_noisy_and_the_tight_one_is_not(records):
    rows = _all(records)
    assert rows["wide"]["noisy"] is True
    assert rows["tight"]["noisy"] is False and rows["plain"]["noisy"] is False
    assert rows["wide"]["speedup"]["spread"] > NOISE_BOUND >= rows["tight"]["speedup"]["spread"]
    for category in ("code", "docs"):  # every record is judged, not only "all"
        assert next(r for r in records if r["contender"] == "wide" and r["category"] == category)["noisy"]


def test_figures_are_medians_over_rounds_with_the_interquartile_spread(records):
    wide = _all(records)["wide"]
    speedups = [1.0 / s for s in WIDE_SECONDS]  # plain takes 1 s a question in every round
    assert wide["speedup"]["median"] == pytest.approx(statistics.median(speedups))  # 2.0, where the mean is 2.67
    q1, _, q3 = statistics.quantiles(speedups, n=4, method="inclusive")
    assert wide["speedup"]["spread"] == pytest.approx((q3 - q1) / statistics.median(speedups))
    assert wide["speedup"]["rounds"] == pytest.approx(speedups) and wide["rounds"] == 5
    rates = [TOKENS / s for s in WIDE_SECONDS]
    assert wide["tokens_per_second"]["median"] == pytest.approx(statistics.median(rates))
    assert wide["mean_accepted_length"] == {"median": 2.0, "spread": 0.0, "rounds": [2.0] * 5}  # not timed: exact


def test_one_slow_round_among_five_moves_neither_the_median_nor_the_flag():
    slow = [0.50, 0.50, 5.00, 0.51, 0.49]  # one round meets a burst of load
    rows = _all(summarize(_rounds({"plain": PLAIN_SECONDS, "tight": slow}), CONTENDERS[:2], None, greedy=True))
    assert rows["tight"]["speedup"]["median"] == pytest.approx(2.0) and not rows["tight"]["noisy"]
    assert statistics.fmean(rows["tight"]["speedup"]["rounds"]) < 1.7  # what a mean would have reported


def test_the_bound_decides_the_flag(records):
    runs = _rounds({"plain": PLAIN_SECONDS, "tight": TIGHT_SECONDS, "wide": WIDE_SECONDS})
    assert not _all(summarize(runs, CONTENDERS, None, True, noise_bound=10.0))["wide"]["noisy"]
    assert _all(summarize(runs, CONTENDERS, None, True, noise_bound=0.01))["tight"]["noisy"]
    assert noisy_contenders(runs, CONTENDERS) == {"wide"}


def test_the_json_records_median_spread_rounds_and_noisy_per_row(records):
    document = json.loads(json.dumps({"records": records}))  # what session writes, NaN-free
    for r in document["records"]:
        assert isinstance(r["noisy"], bool) and r["rounds"] == 5 and r["noise_bound"] == NOISE_BOUND
        for measure in ("tokens_per_second", "speedup", "speedup_over_eager", "mean_accepted_length"):
            assert set(r[measure]) == {"median", "spread", "rounds"} and len(r[measure]["rounds"]) == 5


def test_the_table_marks_the_noisy_row_and_states_the_bound(records):
    text = table(records)
    lines = text.splitlines()
    header = lines[0].split()
    assert header[-1] == "noisy"
    row = {line.split()[0]: line.split() for line in lines[2:5]}
    assert row["wide"][-1] == "yes" and row["tight"][-1] == "-" and row["plain"][-1] == "-"
    assert "2.00x±" in lines[4]  # the median speedup, with its spread as a percentage
    footnote = lines[-1]
    assert footnote.startswith("noisy: wide (5 rounds)") and "10%" in footnote and "tight" not in footnote
    quiet = [r for r in records if r["contender"] != "wide"]
    assert "noisy:" not in table(quiet) and all(line.endswith("-") for line in table(quiet).splitlines()[2:])


def test_the_csv_has_the_noisy_column(records):
    rows = list(csv.DictReader(io.StringIO(csv_text(records))))
    flags = {r["contender"]: r["noisy"] for r in rows if r["category"] == "all"}
    assert flags == {"plain": "False", "tight": "False", "wide": "True"} and rows[0]["noise_bound"] == "0.1"
    assert {"speedup_median", "speedup_spread", "rounds"} <= set(rows[0])


def test_the_plot_hatches_the_noisy_bar(records, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("matplotlib")
    from matplotlib.container import BarContainer
    from matplotlib.figure import Figure

    from specdec.bench.plots import write_plots

    saved: list[Figure] = []
    original = Figure.savefig

    def keep(self: Figure, *args: Any, **kwargs: Any) -> None:
        saved.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    write_plots(records, tmp_path)
    axes = saved[0].axes[0]  # speedup.png
    measured = next(c for c in axes.containers if isinstance(c, BarContainer))
    assert [bool(bar.get_hatch()) for bar in measured] == [False, False, True]  # plain, tight, wide
    legend = axes.get_legend()
    assert legend is not None and "noisy (spread > 10%)" in [text.get_text() for text in legend.get_texts()]


class FakeClock:
    """Seconds per question for each contender in each round: `noisy_until` rounds of the wide
    contender's scattered timings, then steady ones."""

    def __init__(self, noisy_until: int) -> None:
        self.noisy_until = noisy_until
        self.rounds: list[tuple[int, tuple[str, ...]]] = []

    def seconds(self, label: str, index: int) -> float:
        if label == "wide" and index < self.noisy_until:
            return WIDE_SECONDS[index % len(WIDE_SECONDS)]
        return {"plain": 1.0, "tight": 0.5, "wide": 0.4}[label] * (1 + 0.01 * (index % 3))

    def one_round(self, index: int, chosen: Sequence[Contender]) -> list[Run]:
        self.rounds.append((index, tuple(c.label for c in chosen)))
        if index < 0:
            return []
        return [_run(c.label, question, index, self.seconds(c.label, index)) for c in chosen for question in QUESTIONS]


def _repeat(clock: FakeClock, max_repeats: int) -> list[Run]:
    return repeat_rounds(CONTENDERS, clock.one_round, 3, 1, max_repeats,
                         lambda runs: noisy_contenders(runs, CONTENDERS, NOISE_BOUND))


def test_a_quiet_machine_finishes_in_the_default_rounds():
    clock = FakeClock(noisy_until=0)
    runs = _repeat(clock, max_repeats=9)
    assert clock.rounds == [(-1, ("plain", "tight", "wide"))] + [(i, ("plain", "tight", "wide")) for i in range(3)]
    assert {r.repeat for r in runs} == {0, 1, 2}


def test_a_noisy_row_gets_more_rounds_until_its_spread_narrows():
    clock = FakeClock(noisy_until=3)  # three scattered rounds, then a quiet machine
    runs = _repeat(clock, max_repeats=12)
    extra = clock.rounds[4:]
    assert extra and all(labels == ("plain", "wide") for _, labels in extra)  # the quiet row is not rerun
    assert len(clock.rounds) - 1 < 12  # it stopped before the limit
    rows = _all(summarize(runs, CONTENDERS, None, greedy=True))
    assert rows["tight"]["rounds"] == 3 and rows["wide"]["rounds"] == 3 + len(extra)
    assert not rows["wide"]["noisy"] and rows["plain"]["rounds"] == rows["wide"]["rounds"]


def test_a_row_that_stays_noisy_runs_to_the_limit_and_is_flagged():
    clock = FakeClock(noisy_until=100)
    runs = _repeat(clock, max_repeats=7)
    assert [index for index, _ in clock.rounds] == list(range(-1, 7))
    rows = _all(summarize(runs, CONTENDERS, None, greedy=True))
    assert rows["wide"]["noisy"] and rows["wide"]["rounds"] == 7 and rows["tight"]["rounds"] == 3
    with pytest.raises(ValueError, match=r"max_repeats must be >= repeats \(3\), got 2"):
        _repeat(clock, max_repeats=2)


def test_run_bench_reruns_only_the_rows_called_noisy():
    from tiny import tiny_model

    model = tiny_model(vocab_size=32, hidden=16, layers=1)
    contenders = [Contender("plain"), Contender("ngram", drafter="ngram", k=2),
                  Contender("ngram:k=3", drafter="ngram", k=3)]
    noisy_calls: list[int] = []

    def noisy(runs: Sequence[Run]) -> set[str]:  # a fake verdict: ngram is noisy for two more rounds
        noisy_calls.append(len({r.repeat for r in runs}))
        return {"ngram"} if len({r.repeat for r in runs if r.contender == "ngram"}) < 4 else set()

    runs, _ = run_bench(model, lambda turns, answers, index: [1, 2, 3, 1, 2, 3], lambda ids: "",
                        [Question("q", "code", ("a",))], contenders, Sampling(), max_new_tokens=4, repeats=2,
                        warmup=0, max_repeats=6, noisy=noisy)
    rounds = {c.label: sorted({r.repeat for r in runs if r.contender == c.label}) for c in contenders}
    assert rounds == {"plain": [0, 1, 2, 3], "ngram": [0, 1, 2, 3], "ngram:k=3": [0, 1]}
    assert noisy_calls == [2, 3, 4]


def test_the_config_states_the_round_limit_and_refuses_bad_bounds(tmp_path: Path):
    from specdec.bench.session import BenchConfig

    assert BenchConfig(target=tmp_path, drafters=()).repeat_limit == 9  # 3 x the default 3 rounds
    assert BenchConfig(target=tmp_path, drafters=(), repeats=2, max_repeats=5).repeat_limit == 5
    with pytest.raises(ValueError, match=r"--max-repeats\) must be >= repeats \(3\), got 2"):
        BenchConfig(target=tmp_path, drafters=(), max_repeats=2)
    with pytest.raises(ValueError, match=r"--noise-bound\) must be > 0.*got 0"):
        BenchConfig(target=tmp_path, drafters=(), noise_bound=0.0)
