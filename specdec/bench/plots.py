"""The bench's PNG plots (matplotlib, no display needed): speedup per contender (median over
rounds, the interquartile range as its error bar, noisy rows hatched) with its ideal beside it,
acceptance per draft position, and mean accepted length against k."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdec.bench.report import quartiles

__all__ = ["write_batch_plot", "write_plots"]

MEASURED, IDEAL, NOISY = "#3b6ea5", "#b9c9dd", "#c0392b"  # bar colours; NOISY edges a noisy row's hatched bar


def _all(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["category"] == "all"]


def _quartile_errors(measure: dict[str, Any]) -> tuple[float, float]:
    """(median - Q1, Q3 - median) over the rounds: an error bar spanning the interquartile range."""
    present = [v for v in measure["rounds"] if v is not None]
    if not present:
        return 0.0, 0.0
    q1, median, q3 = quartiles(present)
    return median - q1, q3 - median


def write_plots(records: Sequence[dict[str, Any]], directory: Path) -> list[Path]:
    """Write the plots into `directory`; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    directory.mkdir(parents=True, exist_ok=True)
    rows = _all(records)
    written = []

    figure, axes = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4))
    xs = list(range(len(rows)))
    measured = [r["speedup"]["median"] or 0 for r in rows]
    spans = [_quartile_errors(r["speedup"]) for r in rows]
    errors = [[low for low, _ in spans], [high for _, high in spans]]  # (2, rows): below and above the median
    ideal = [r["ideal_speedup"]["median"] or 0 for r in rows]
    bars = axes.bar([x - 0.2 for x in xs], measured, 0.4, yerr=errors, color=MEASURED)
    axes.bar([x + 0.2 for x in xs], ideal, 0.4, color=IDEAL)
    handles = [Patch(color=MEASURED, label="measured (median, IQR)"),
               Patch(color=IDEAL, label="ideal: MAL·T(1)/(T(k+1)+T_draft)")]
    noisy = [(bar, r) for bar, r in zip(bars, rows) if r["noisy"]]
    for bar, _ in noisy:  # a noisy row: hatched and pale, named in the legend
        bar.set(hatch="//", alpha=0.45, edgecolor=NOISY)
    if noisy:
        handles.append(Patch(facecolor=MEASURED, alpha=0.45, hatch="//", edgecolor=NOISY,
                             label=f"noisy (spread > {noisy[0][1]['noise_bound']:.0%})"))
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xticks(xs, [f"{r['contender']}" for r in rows], rotation=30, ha="right")
    axes.set_ylabel("speedup over plain decoding")
    axes.legend(handles=handles)
    figure.tight_layout()
    written.append(directory / "speedup.png")
    figure.savefig(written[-1], dpi=120)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(6, 4))
    for r in rows:
        rates = r["acceptance_per_position"]
        if rates and any(v is not None for v in rates):
            axes.plot(range(1, len(rates) + 1), [float("nan") if v is None else v for v in rates], marker="o",
                      label=r["contender"])
    axes.set_xlabel("draft position")
    axes.set_ylabel("acceptance (accepted / drafted there)")
    axes.set_ylim(0, 1)
    axes.legend(fontsize=8)
    figure.tight_layout()
    written.append(directory / "acceptance_per_position.png")
    figure.savefig(written[-1], dpi=120)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(6, 4))
    by_drafter: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["drafter"] and isinstance(r["k"], int) and r["peer"] is None:
            by_drafter.setdefault(r["drafter"], []).append((r["k"], r["mean_accepted_length"]["median"]))
    for name, points in sorted(by_drafter.items()):
        points.sort()
        axes.plot([k for k, _ in points], [m for _, m in points], marker="o", label=name)
    axes.set_xlabel("k (draft tokens per step)")
    axes.set_ylabel("mean accepted length")
    axes.legend(fontsize=8)
    figure.tight_layout()
    written.append(directory / "mean_accepted_length_vs_k.png")
    figure.savefig(written[-1], dpi=120)
    plt.close(figure)
    return written


def write_batch_plot(records: Sequence[dict[str, Any]], directory: Path) -> Path:
    """Speedup over plain decoding against batch size (`specdec bench --batch`), a line per
    drafter row (median, the IQR as error bars, noisy points hollow); returns the file."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    labels = list(dict.fromkeys(r["contender"] for r in records if r["contender"] != "plain"))
    for label in labels:
        points = sorted((r for r in records if r["contender"] == label), key=lambda r: r["batch"])
        xs = [r["batch"] for r in points]
        ys = [r["speedup"]["median"] or 0 for r in points]
        spans = [_quartile_errors(r["speedup"]) for r in points]
        line = axes.errorbar(xs, ys, yerr=[[low for low, _ in spans], [high for _, high in spans]], marker="o",
                             capsize=2, label=label, linestyle="--" if points[0]["peer"] else "-")
        noisy = [(x, y) for x, y, r in zip(xs, ys, points) if r["noisy"]]
        if noisy:
            axes.scatter([x for x, _ in noisy], [y for _, y in noisy], s=80, facecolors="white",
                         edgecolors=line.lines[0].get_color(), zorder=3)
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xscale("log", base=2)
    batches = sorted({r["batch"] for r in records})
    axes.set_xticks(batches, [str(b) for b in batches])
    axes.set_xlabel("batch size (rows decoded together)")
    axes.set_ylabel("speedup over plain decoding at that batch size")
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    path = directory / "batch_speedup.png"
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
