"""From runs to figures: one record per contender × category (and "all"), each measure with
its mean and spread (sample standard deviation) over the repeats; the terminal table, the CSV
and the JSON document built from those records."""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Sequence
from typing import Any

from specdec.bench.costs import ideal_speedup
from specdec.bench.runner import Contender, Run
from specdec.types import Stats, total_stats

__all__ = ["MEASURES", "SCHEMA", "csv_text", "summarize", "table", "tree_sizes"]

SCHEMA = "specdec-bench/2"
MEASURES = ("mean_accepted_length", "acceptance_rate", "tokens_per_second", "speedup", "speedup_over_eager",
            "ideal_speedup", "ideal_ratio", "draft_share", "verify_share", "draft_size", "verify_ms")


def _spread(values: list[float | None]) -> dict[str, float | None]:
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return {"mean": None, "std": None}
    return {"mean": statistics.fmean(present), "std": statistics.stdev(present) if len(present) > 1 else 0.0}


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
    """(category, the stats of one repeat) for every category ("all" included) and repeat: the
    groups each record's figures are computed over."""
    categories = sorted({r.category for r in runs}) + ["all"]
    mine = [r for r in runs if r.contender == contender.label]
    return [(category, [r.stats for r in mine if r.repeat == repeat and category in ("all", r.category)])
            for category in categories for repeat in sorted({r.repeat for r in runs})]


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
              compiled: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Records per contender and category ("all" last), in contender order.

    costs and tree_costs: T of a forward by row count, per engine ("eager", "compiled"); tree
    contenders' ideal speedups use the tree costs where measured. A contender's speedup is over
    its baseline (plain decoding on its engine); speedup_over_eager over eager plain decoding
    when it ran. compiled: the seconds each contender spent compiling."""
    eager_plain = next((c.label for c in contenders if c.drafter is None and c.peer is None and not c.compile), None)
    categories = sorted({r.category for r in runs}) + ["all"]
    repeats = sorted({r.repeat for r in runs})
    plain_tokens = {(r.question, r.turn, r.repeat): r.tokens for r in runs if r.contender == "plain"}
    records = []
    for contender in contenders:
        mine = [r for r in runs if r.contender == contender.label]
        for category in categories:
            chosen = [r for r in mine if category in ("all", r.category)]
            if not chosen:
                continue
            per_repeat = []
            for repeat in repeats:
                stats = total_stats([r.stats for r in chosen if r.repeat == repeat])

                def baseline(label: str | None) -> Stats | None:
                    return None if label is None else total_stats(
                        [r.stats for r in runs if r.contender == label and r.repeat == repeat
                         and category in ("all", r.category)])

                plain = baseline(contender.baseline)
                assert plain is not None
                engine_costs = (costs or {}).get(contender.engine)
                per_repeat.append(_figures(stats, plain, contender, engine_costs,
                                           (tree_costs or {}).get(contender.engine), baseline(eager_plain)))
            record: dict[str, Any] = {"contender": contender.label, "drafter": contender.drafter,
                                      "peer": contender.peer, "k": contender.k, "tree": contender.tree,
                                      "engine": None if contender.peer else contender.engine, "category": category,
                                      "compile_seconds": (compiled or {}).get(contender.label, 0.0),
                                      "runs": len(chosen), "new_tokens": sum(r.stats.new_tokens for r in chosen)}
            for measure in MEASURES:
                record[measure] = _spread([f[measure] for f in per_repeat])
            width = max(len(f["acceptance_per_position"]) for f in per_repeat)
            record["acceptance_per_position"] = [
                _spread([f["acceptance_per_position"][i] if i < len(f["acceptance_per_position"]) else None
                         for f in per_repeat])["mean"] for i in range(width)]
            lengths = [n for r in chosen for n in r.draft_lengths]
            record["mean_draft_length"] = statistics.fmean(lengths) if lengths else None
            record["same_as_plain"] = (all(r.tokens == plain_tokens[(r.question, r.turn, r.repeat)] for r in chosen)
                                       if greedy else None)
            records.append(record)
    return records


def _cell(value: dict[str, float | None], digits: int, suffix: str = "", spread: bool = True) -> str:
    if value["mean"] is None:
        return "-"
    text = f"{value['mean']:.{digits}f}{suffix}"
    return f"{text}±{value['std']:.{digits}f}" if spread and value["std"] else text


HEADER = ("contender", "k", "mean acc. len", "acceptance", "nodes", "verify ms", "tokens/s", "speedup", "ideal",
          "of ideal", "drafting", "same as plain")


def table(records: Sequence[dict[str, Any]], category: str = "all") -> str:
    """The records of one category as an aligned text table; with compiled rows, two more
    columns: the speedup over eager plain decoding, and the seconds spent compiling."""
    chosen = [r for r in records if r["category"] == category]
    compiled = any(r.get("engine") == "compiled" for r in chosen)
    header = HEADER + (("vs eager", "compile s") if compiled else ())
    rows = [header]
    for r in chosen:
        same = "-" if r["same_as_plain"] is None else ("yes" if r["same_as_plain"] else "NO")
        share = r["draft_share"]
        row: tuple[str, ...] = (r["contender"], str(r["k"]) if r["k"] else "-", _cell(r["mean_accepted_length"], 2),
               _cell(r["acceptance_rate"], 2, spread=False), _cell(r["draft_size"], 1, spread=False),
               _cell(r["verify_ms"], 2, spread=False), _cell(r["tokens_per_second"], 0),
               _cell(r["speedup"], 2, "x"), _cell(r["ideal_speedup"], 2, "x", spread=False),
               _cell(r["ideal_ratio"], 2, spread=False),
               "-" if share["mean"] is None else f"{share['mean']:.0%}", same)
        if compiled:
            row += (_cell(r["speedup_over_eager"], 2, "x", spread=False), f"{r['compile_seconds']:.1f}")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def csv_text(records: Sequence[dict[str, Any]]) -> str:
    """One CSV row per record: each measure as `<name>_mean` and `<name>_std` columns."""
    out = io.StringIO()
    columns = ["contender", "drafter", "peer", "k", "tree", "engine", "category", "runs", "new_tokens",
               "compile_seconds"]
    columns += [f"{m}_{part}" for m in MEASURES for part in ("mean", "std")]
    columns += ["acceptance_per_position", "mean_draft_length", "same_as_plain"]
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in records:
        row = {key: r[key] for key in ("contender", "drafter", "peer", "k", "tree", "engine", "category", "runs",
                                       "new_tokens", "compile_seconds", "mean_draft_length", "same_as_plain")}
        for m in MEASURES:
            row[f"{m}_mean"], row[f"{m}_std"] = r[m]["mean"], r[m]["std"]
        row["acceptance_per_position"] = ";".join("" if v is None else f"{v:.4f}" for v in r["acceptance_per_position"])
        writer.writerow(row)
    return out.getvalue()
