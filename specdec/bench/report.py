"""From runs to figures: one record per contender × category (and "all"), each measure as its
median over the rounds with a robust spread (the interquartile range over the median, `spread`)
and every round's value; a record is `noisy` when a timed figure (NOISE_MEASURES) spreads more
than a stated bound. Beside the rounds, the prompts: the mean accepted length and the speedup
with a 95% bootstrap interval over prompts, the ranks those intervals support among the
drafters (`specdec.intervals`), and the part of the accepted length that came from degenerate
loops (`specdec.data.loops`). The terminal table, the CSV and the JSON document built from those
records."""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Sequence
from typing import Any

from specdec.bench.runner import Contender, Run
from specdec.data.loops import loop_count
from specdec.intervals import Interval, rank_labels, ranks, ratio_interval
from specdec.types import Stats, total_stats

__all__ = ["MEASURES", "NOISE_BOUND", "NOISE_MEASURES", "SCHEMA", "csv_text", "ideal_speedup", "noisy_contenders",
           "over_rounds", "quartiles", "summarize", "table", "tree_sizes"]

SCHEMA = "specdec-bench/4"
MEASURES = ("mean_accepted_length", "acceptance_rate", "tokens_per_second", "speedup", "speedup_over_eager",
            "ideal_speedup", "ideal_ratio", "draft_share", "verify_share", "draft_size", "verify_ms")
NOISE_BOUND = 0.10  # a row is noisy when a NOISE_MEASURES figure's spread (IQR / median over rounds) exceeds this
NOISE_MEASURES = ("tokens_per_second", "speedup", "speedup_over_eager")  # the timed figures the flag judges


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile), interpolated between the sorted values
    (`statistics.quantiles(method="inclusive")`); a single value is all three."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def over_rounds(values: Sequence[float | None]) -> dict[str, Any]:
    """A measure over rounds: `median`, `spread` = (Q3 - Q1) / |median| (None with fewer than two
    rounds, or a zero median with values apart), and `rounds`, each round's value (None: none).

    The interquartile range ignores the most extreme quarter of rounds on each side, so one slow
    round among five moves neither figure, and more rounds can narrow it (a range cannot)."""
    rounds = [None if v is None or math.isnan(v) else v for v in values]
    present = [v for v in rounds if v is not None]
    if not present:
        return {"median": None, "spread": None, "rounds": rounds}
    q1, median, q3 = quartiles(present)
    spread = None
    if len(present) > 1:
        spread = 0.0 if q3 == q1 else (q3 - q1) / abs(median) if median else None
    return {"median": median, "spread": spread, "rounds": rounds}


def _noisy(record: dict[str, Any], bound: float) -> bool:
    return any(record[m]["spread"] is not None and record[m]["spread"] > bound for m in NOISE_MEASURES)


def _figures(stats: Stats, plain: Stats, contender: Contender, costs: dict[int, float] | None,
             tree_costs: dict[int, float] | None = None, eager: Stats | None = None) -> dict[str, Any]:
    mal = stats.mean_accepted_length
    ours = contender.peer is None and stats.steps > 0
    figures: dict[str, Any] = {  # transformers' peers report no draft counters: their rates are None
        "mean_accepted_length": mal,
        "acceptance_rate": stats.acceptance_rate if contender.drafter is not None else None,
        "tokens_per_second": stats.tokens_per_second,
        "speedup": plain.wall_seconds / stats.wall_seconds if stats.wall_seconds else None,
        "speedup_over_eager": eager.wall_seconds / stats.wall_seconds if eager is not None and stats.wall_seconds
        else None,
        "draft_share": stats.draft_seconds / stats.wall_seconds if contender.peer is None and stats.wall_seconds
        else None,
        "verify_share": stats.verify_seconds / stats.wall_seconds if contender.peer is None and stats.wall_seconds
        else None,
        "ideal_speedup": None, "ideal_ratio": None,
        # the width of each verify forward (draft tokens or tree nodes) and its time
        "draft_size": stats.drafted / stats.steps if ours and contender.drafter is not None else None,
        "verify_ms": 1000 * stats.verify_seconds / stats.steps if ours else None,
        "acceptance_per_position": [a / d if d else None for a, d in
                                    zip(stats.accepted_per_position, stats.drafted_per_position)],
    }
    if costs and contender.drafter is not None and stats.steps:
        k_eff = max(1, round(stats.drafted / stats.steps))
        if contender.tree and tree_costs:  # a tree forward of k_eff nodes and the root
            verify = tree_costs.get(k_eff + 1)
        else:  # a chain (or a tree verified as its first path on a target that cannot run trees)
            verify = costs.get(k_eff + 1) or costs[max(costs)]
        if verify is not None:
            ideal = ideal_speedup(mal, costs[1], verify, stats.draft_seconds / stats.steps)
            figures["ideal_speedup"] = ideal
            figures["ideal_ratio"] = figures["speedup"] / ideal if figures["speedup"] and ideal else None
    return figures


def _groups(runs: Sequence[Run], contender: Contender) -> list[tuple[str, list[Stats]]]:
    """(category, the stats of one round) for every category ("all" included) and every round the
    contender ran in: the groups each record's figures are computed over."""
    categories = sorted({r.category for r in runs}) + ["all"]
    mine = [r for r in runs if r.contender == contender.label]
    return [(category, [r.stats for r in mine if r.repeat == repeat and category in ("all", r.category)])
            for category in categories for repeat in sorted({r.repeat for r in mine})]


def tree_sizes(runs: Sequence[Run], contenders: Sequence[Contender]) -> list[int]:
    """The tree forward sizes (nodes per step + the root) the tree rows' ideal speedups need."""
    sizes = set()
    for contender in contenders:
        if contender.tree:
            for _, group in _groups(runs, contender):
                stats = total_stats(group)
                if stats.steps:
                    sizes.add(max(1, round(stats.drafted / stats.steps)) + 1)
    return sorted(sizes)


def summarize(runs: Sequence[Run], contenders: Sequence[Contender], costs: dict[str, dict[int, float]] | None,
              greedy: bool, tree_costs: dict[str, dict[int, float]] | None = None,
              compiled: dict[str, float] | None = None, noise_bound: float = NOISE_BOUND,
              over_prompts_too: bool = True) -> list[dict[str, Any]]:
    """Records per contender and category ("all" last), in contender order.

    Each measure is computed per round (the rounds the contender ran in: a noisy one may have run
    more) and given as `{"median", "spread", "rounds"}` (`over_rounds`); `rounds` counts them and
    `noisy` says whether a NOISE_MEASURES figure spreads more than `noise_bound` (kept as the
    record's `noise_bound`, so the table and plots state the bound it was judged by).
    costs and tree_costs: T of a forward by row count, per engine ("eager", "compiled"); tree
    contenders' ideal speedups use the tree costs where measured. A contender's speedup is over
    its baseline (plain decoding on its engine, same round); speedup_over_eager over eager plain
    decoding when it ran. compiled: the seconds each contender spent compiling."""
    eager_plain = next((c.label for c in contenders if c.drafter is None and c.peer is None and not c.compile), None)
    categories = sorted({r.category for r in runs}) + ["all"]
    plain_tokens = {(r.question, r.turn, r.repeat): r.tokens for r in runs if r.contender == "plain"}
    records = []
    for contender in contenders:
        mine = [r for r in runs if r.contender == contender.label]
        for category in categories:
            chosen = [r for r in mine if category in ("all", r.category)]
            if not chosen:
                continue
            per_round = []
            for repeat in sorted({r.repeat for r in chosen}):
                stats = total_stats([r.stats for r in chosen if r.repeat == repeat])

                def baseline(label: str | None) -> Stats | None:
                    return None if label is None else total_stats(
                        [r.stats for r in runs if r.contender == label and r.repeat == repeat
                         and category in ("all", r.category)])

                plain = baseline(contender.baseline)
                assert plain is not None
                engine_costs = (costs or {}).get(contender.engine)
                per_round.append(_figures(stats, plain, contender, engine_costs,
                                          (tree_costs or {}).get(contender.engine), baseline(eager_plain)))
            record: dict[str, Any] = {"contender": contender.label, "drafter": contender.drafter,
                                      "peer": contender.peer, "k": contender.k, "tree": contender.tree,
                                      "engine": None if contender.peer else contender.engine, "category": category,
                                      "compile_seconds": (compiled or {}).get(contender.label, 0.0),
                                      "runs": len(chosen), "rounds": len(per_round),
                                      "new_tokens": sum(r.stats.new_tokens for r in chosen)}
            for measure in MEASURES:
                record[measure] = over_rounds([f[measure] for f in per_round])
            record["noisy"], record["noise_bound"] = _noisy(record, noise_bound), noise_bound
            width = max(len(f["acceptance_per_position"]) for f in per_round)
            record["acceptance_per_position"] = [
                over_rounds([f["acceptance_per_position"][i] if i < len(f["acceptance_per_position"]) else None
                              for f in per_round])["median"] for i in range(width)]
            lengths = [n for r in chosen for n in r.draft_lengths]
            record["mean_draft_length"] = statistics.fmean(lengths) if lengths else None
            record["same_as_plain"] = (all(r.tokens == plain_tokens[(r.question, r.turn, r.repeat)] for r in chosen)
                                       if greedy else None)
            if over_prompts_too:
                baseline_runs = [r for r in runs
                                 if r.contender == contender.baseline and category in ("all", r.category)]
                record.update(over_prompts(chosen, baseline_runs, contender))
            records.append(record)
    if over_prompts_too:
        _rank(records)
    return records


def over_prompts(chosen: Sequence[Run], baseline: Sequence[Run], contender: Contender) -> dict[str, Any]:
    """The record's figures over prompts (each question turn one prompt): per prompt the tokens
    emitted, target forwards and median seconds over the rounds (`per_prompt`), the mean accepted
    length and the speedup over the baseline with their 95% bootstrap intervals, and the part of
    the accepted length made of loop tokens (`from_loops`, accepted loop tokens per forward, and
    `loop_share`, of the accepted tokens)."""
    units = list(dict.fromkeys((r.question, r.turn) for r in chosen))  # the order the prompts were decoded in
    new = [sum(r.stats.new_tokens for r in chosen if (r.question, r.turn) == u) for u in units]
    steps = [sum(r.stats.steps for r in chosen if (r.question, r.turn) == u) for u in units]
    seconds = [statistics.median(r.stats.wall_seconds for r in chosen if (r.question, r.turn) == u) for u in units]
    plain = [statistics.median([r.stats.wall_seconds for r in baseline if (r.question, r.turn) == u] or [math.nan])
             for u in units]
    out: dict[str, Any] = {"per_prompt": {"prompts": [f"{q}#{t}" for q, t in units], "new_tokens": new,
                                          "steps": steps, "seconds": seconds, "baseline_seconds": plain},
                           "mean_accepted_length_interval": (ratio_interval(new, steps).as_dict() if sum(steps)
                                                             else None),
                           "speedup_interval": (ratio_interval(plain, seconds).as_dict()
                                                if sum(seconds) > 0 and not any(math.isnan(x) for x in plain) else None),
                           "from_loops": None, "loop_share": None}
    if contender.drafter is not None and all(len(r.stats.accepted_per_step) == r.stats.steps for r in chosen):
        counts = [loop_count(r.tokens, r.stats.accepted_per_step) for r in chosen]  # accepted tokens on the output
        accepted, looped = sum(c.accepted for c in counts), sum(c.loop_accepted for c in counts)
        total_steps = sum(r.stats.steps for r in chosen)
        out["from_loops"] = looped / total_steps if total_steps else 0.0
        out["loop_share"] = looped / accepted if accepted else 0.0
    return out


def _rank(records: list[dict[str, Any]]) -> None:
    """Each specdec drafter row's `rank` by mean accepted length and `speed_rank` by speedup among
    the drafter rows of its category and engine, as `specdec.intervals.ranks` gives them: rows the
    paired bootstrap over prompts cannot order share a rank (`=2`)."""
    groups: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for record in records:
        record["rank"] = record["speed_rank"] = None
        if record["drafter"] is not None:
            groups.setdefault((record["category"], record["engine"]), []).append(record)
    for rows in groups.values():
        if len(rows) < 2:
            continue
        by_length = rank_labels(ranks({r["contender"]: (r["per_prompt"]["new_tokens"], r["per_prompt"]["steps"])
                                       for r in rows}))
        times = {r["contender"]: (r["per_prompt"]["baseline_seconds"], r["per_prompt"]["seconds"]) for r in rows
                 if not any(math.isnan(x) for x in r["per_prompt"]["baseline_seconds"])}
        by_speed = rank_labels(ranks(times)) if len(times) == len(rows) else {}
        for r in rows:
            r["rank"], r["speed_rank"] = by_length[r["contender"]], by_speed.get(r["contender"])


def noisy_contenders(runs: Sequence[Run], contenders: Sequence[Contender], noise_bound: float = NOISE_BOUND
                     ) -> set[str]:
    """The labels of the contenders whose "all" record is noisy over the rounds run so far: the
    rows the runner gives another round."""
    return {r["contender"] for r in summarize(runs, contenders, None, False, noise_bound=noise_bound,
                                              over_prompts_too=False)
            if r["category"] == "all" and r["noisy"]}


def _cell(value: dict[str, Any], digits: int, suffix: str = "", spread: bool = True) -> str:
    """The median, and with `spread` its relative spread as a percentage (`1.37x±4%`) when it is
    at least 0.5%."""
    if value["median"] is None:
        return "-"
    text = f"{value['median']:.{digits}f}{suffix}"
    return f"{text}±{value['spread']:.0%}" if spread and value["spread"] and value["spread"] >= 0.005 else text


HEADER = ("contender", "k", "mean acc. len [95%]", "rank", "from loops", "acceptance", "tokens/s", "speedup",
          "[95%]", "speed rank", "ideal", "drafting", "same as plain")


def _interval(value: dict[str, Any] | None) -> str:
    """`[low, high]` of an interval record."""
    return "-" if value is None else Interval.from_dict(value).bounds()


def table(records: Sequence[dict[str, Any]], category: str = "all") -> str:
    """The records of one category as an aligned text table: medians over rounds, `±` the spread
    (IQR / median), and over prompts the 95% intervals of the mean accepted length and the
    speedup with the ranks they support (`=` a shared rank) and the accepted length's part from
    loops. With compiled rows, two more columns: the speedup over eager plain decoding, and the
    seconds spent compiling. Last, `noisy` ("yes" for a noisy row), and under the table a
    footnote naming the noisy rows, their rounds and the bound they exceeded. The node count,
    verify milliseconds and share of the ideal are in the JSON and CSV."""
    chosen = [r for r in records if r["category"] == category]
    compiled = any(r.get("engine") == "compiled" for r in chosen)
    header = HEADER + (("vs eager", "compile s") if compiled else ()) + ("noisy",)
    rows = [header]
    for r in chosen:
        same = "-" if r["same_as_plain"] is None else ("yes" if r["same_as_plain"] else "NO")
        share = r["draft_share"]
        length = _cell(r["mean_accepted_length"], 2, spread=False)
        if r["mean_accepted_length_interval"] is not None and length != "-":
            length += " " + _interval(r["mean_accepted_length_interval"])
        row: tuple[str, ...] = (r["contender"], str(r["k"]) if r["k"] else "-", length, r["rank"] or "-",
               "-" if r["from_loops"] is None else f"{r['from_loops']:.2f}",
               _cell(r["acceptance_rate"], 2, spread=False), _cell(r["tokens_per_second"], 0),
               _cell(r["speedup"], 2, "x"), "-" if r["drafter"] is None and r["peer"] is None
               else _interval(r["speedup_interval"]), r["speed_rank"] or "-", _cell(r["ideal_speedup"], 2, "x", spread=False),
               "-" if share["median"] is None else f"{share['median']:.0%}", same)
        if compiled:
            row += (_cell(r["speedup_over_eager"], 2, "x"), f"{r['compile_seconds']:.1f}")
        rows.append(row + ("yes" if r["noisy"] else "-",))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    noisy = [r for r in chosen if r["noisy"]]
    named = ", ".join(f"{r['contender']} ({r['rounds']} rounds)" for r in noisy)
    footnote = [(f"noisy: {named}: tokens/s, speedup or vs eager spread more than {noisy[0]['noise_bound']:.0%} "
                 "(interquartile range / median over the rounds): their timings are not to be trusted")] if noisy else []
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:], *footnote])


def csv_text(records: Sequence[dict[str, Any]]) -> str:
    """One CSV row per record: each measure as `<name>_median` and `<name>_spread` columns (the
    rounds' values are in the JSON), the `rounds` it ran and whether it is `noisy`."""
    out = io.StringIO()
    keys = ["contender", "drafter", "peer", "k", "tree", "engine", "category", "runs", "rounds", "new_tokens",
            "compile_seconds"]
    columns = keys + [f"{m}_{part}" for m in MEASURES for part in ("median", "spread")]
    columns += [f"{m}_interval_{end}" for m in ("mean_accepted_length", "speedup") for end in ("low", "high")]
    columns += ["rank", "speed_rank", "from_loops", "loop_share"]
    columns += ["acceptance_per_position", "mean_draft_length", "same_as_plain", "noisy", "noise_bound"]
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in records:
        row = {key: r[key] for key in (*keys, "mean_draft_length", "same_as_plain", "noisy", "noise_bound", "rank",
                                       "speed_rank", "from_loops", "loop_share")}
        for m in ("mean_accepted_length", "speedup"):
            interval = r[f"{m}_interval"] or {}
            row[f"{m}_interval_low"], row[f"{m}_interval_high"] = interval.get("low"), interval.get("high")
        for m in MEASURES:
            row[f"{m}_median"], row[f"{m}_spread"] = r[m]["median"], r[m]["spread"]
        row["acceptance_per_position"] = ";".join("" if v is None else f"{v:.4f}" for v in r["acceptance_per_position"])
        writer.writerow(row)
    return out.getvalue()


def ideal_speedup(mean_accepted_length: float, t1: float, t_verify: float, t_draft: float) -> float:
    """MAL * T(1) / (T(k+1) + T_draft): the speedup if nothing but forwards and drafting cost time."""
    denominator = t_verify + t_draft
    return mean_accepted_length * t1 / denominator if denominator > 0 else float("nan")
