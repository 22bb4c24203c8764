"""`specdec bench --batch 1 2 4 8 ...`: tokens per second against batch size, and the batch size
where each drafter stops paying.

At each batch size B, B prompts (the held-out code prompts, or a Spec-Bench file's first turns,
in order, cycled when there are fewer than B) are decoded together by `specdec.generate_batch`:
plain decoding and every drafter row, on the compiled engine by default; transformers' batched
`generate` (left-padded, its dynamic cache) is the peer. A cell is the batch's tokens per second
(every row's new tokens over the call's wall time, compilation taken off), the median over the
recorded rounds with its spread (IQR / median), and the speedup over plain decoding at the same
B, a round's speedup dividing by that round's plain run. A cell whose spread exceeds the noise
bound is flagged noisy. A drafter stops paying at the smallest measured B where its median
speedup falls below 1. Greedy rows are checked token for token against plain decoding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedModel

from specdec.bench.peers import hf_generate_batch, hf_missing
from specdec.bench.report import NOISE_BOUND, over_rounds
from specdec.bench.runner import Contender
from specdec.decoding.generate import generate_batch
from specdec.plugins import make_drafter
from specdec.protocols import forget
from specdec.runtime.engine import compile_seconds
from specdec.types import Sampling

__all__ = ["BATCH_SCHEMA", "BatchCurveConfig", "curve_table", "run_curve", "stops_paying"]

BATCH_SCHEMA = "specdec-batch/1"


@dataclass(frozen=True)
class BatchCurveConfig:
    """What `specdec bench --batch` runs: the batch sizes, the contenders (plain first), the rest
    as for the batch-1 bench."""

    batches: tuple[int, ...]
    contenders: tuple[Contender, ...]
    sampling: Sampling = field(default_factory=Sampling)
    max_new_tokens: int = 128
    repeats: int = 3
    warmup: int = 1
    seed: int = 0
    peers: bool = True
    noise_bound: float = NOISE_BOUND

    def __post_init__(self) -> None:
        if not self.batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batches):
            raise ValueError(f"--batch takes batch sizes >= 1, got {list(self.batches)}")
        if len(set(self.batches)) != len(self.batches):
            raise ValueError(f"--batch names a batch size twice: {list(self.batches)}")
        if not self.contenders or self.contenders[0].drafter is not None:
            raise ValueError("the batch curve's first contender must be plain decoding (its baseline)")


def run_curve(model: PreTrainedModel, prompts: Sequence[list[int]], config: BatchCurveConfig,
              advance: Callable[[], None] = lambda: None, pad_id: int = 0, made: dict[str, Any] | None = None,
              tokenizer: Any = None) -> list[dict[str, Any]]:
    """Every contender at every batch size; returns one record per (contender, batch size).
    `made`: drafter instances by contender label, instead of building them from the registry;
    `tokenizer`: the target's, for a constraint in the sampling settings. The peer row runs only
    when transformers' generate can apply the settings (`hf_missing`)."""
    peers = config.peers and not hf_missing(config.sampling, batch=True)
    drafters = {c.label: (made or {}).get(c.label) or make_drafter(c.drafter, **c.options)
                for c in config.contenders if c.drafter is not None}
    records = []
    for batch in sorted(config.batches):
        rows = [list(prompts[i % len(prompts)]) for i in range(batch)]
        rounds: dict[str, list[tuple[float, float, list[list[int]]]]] = {}  # label -> (tok/s, MAL, tokens) per round
        for repeat in range(-config.warmup, config.repeats):
            for contender in config.contenders:
                drafter = drafters.get(contender.label)
                forget(drafter)
                before = compile_seconds()
                result = generate_batch(model, rows, drafter=drafter, num_draft_tokens=contender.k if contender.k == "auto" else int(contender.k or 0),
                                        max_new_tokens=config.max_new_tokens, sampling=config.sampling,
                                        seed=config.seed + repeat, compile=contender.compile,
                                        tokenizer=tokenizer, verify_rule=contender.verify_rule)
                wall = result.totals.wall_seconds - (compile_seconds() - before)
                steps = sum(row.stats.steps for row in result)
                figures = (result.totals.new_tokens / wall, result.totals.new_tokens / steps if steps else 0.0,
                           [row.tokens for row in result])
                if repeat >= 0:
                    rounds.setdefault(contender.label, []).append(figures)
                advance()
            if peers:
                start = time.perf_counter()
                tokens = hf_generate_batch(model, rows, config.max_new_tokens, config.sampling, pad_id)
                wall = time.perf_counter() - start
                if repeat >= 0:
                    rounds.setdefault("hf-batched", []).append((sum(map(len, tokens)) / wall, 1.0, tokens))
                advance()
        plain = rounds[config.contenders[0].label]
        labels = [c.label for c in config.contenders] + (["hf-batched"] if peers else [])
        for label in labels:
            mine = rounds[label]
            row = next((c for c in config.contenders if c.label == label), None)  # None: the peer
            speed = over_rounds([tps for tps, _, _ in mine])
            speedup = over_rounds([tps / base for (tps, _, _), (base, _, _) in zip(mine, plain)])
            same = all(tokens == plain[0][2] for _, _, tokens in mine) if config.sampling.greedy else None
            records.append({
                "contender": label, "drafter": None if row is None else row.drafter,
                "tree": bool(row is not None and row.tree), "peer": "hf-batched" if row is None else None,
                "batch": batch, "tokens_per_second": speed, "speedup": speedup,
                "mean_accepted_length": over_rounds([mal for _, mal, _ in mine]) if row is not None else None,
                "same_as_plain": same, "noise_bound": config.noise_bound,
                "noisy": any(m["spread"] is not None and m["spread"] > config.noise_bound for m in (speed, speedup))})
    return records


def stops_paying(records: Sequence[dict[str, Any]]) -> dict[str, int | None]:
    """Each contender's smallest batch size whose median speedup is below 1 (None: it pays at every
    measured size). Plain decoding is its own baseline and is left out."""
    out: dict[str, int | None] = {}
    for record in sorted(records, key=lambda r: r["batch"]):
        label = record["contender"]
        if label == "plain" or record["peer"] is not None:
            continue
        out.setdefault(label, None)
        median = record["speedup"]["median"]
        if out[label] is None and median is not None and median < 1:
            out[label] = record["batch"]
    return out


def curve_table(records: Sequence[dict[str, Any]]) -> str:
    """A text table: one line per contender, per batch size its tokens/s and speedup (median;
    `~` marks a noisy cell), and the batch size where it stops paying."""
    batches = sorted({r["batch"] for r in records})
    labels = list(dict.fromkeys(r["contender"] for r in records))
    cells = {(r["contender"], r["batch"]): r for r in records}
    paying = stops_paying(records)
    width = max(len(label) for label in labels) + 2
    head = "".join(f"{f'B={b}':>21}" for b in batches)
    lines = [f"{'contender':<{width}}{head}  stops paying at", "-" * (width + 21 * len(batches) + 17)]
    for label in labels:
        line = f"{label:<{width}}"
        for batch in batches:
            record = cells.get((label, batch))
            if record is None:
                line += f"{'-':>21}"
                continue
            tps, speedup = record["tokens_per_second"]["median"], record["speedup"]["median"]
            mark = "~" if record["noisy"] else ""
            line += f"{f'{tps:,.0f} tok/s {speedup:.2f}x{mark}':>21}"
        if label == "plain" or label == "hf-batched":
            line += "  (baseline)" if label == "plain" else "  (transformers)"
        else:
            stop = paying.get(label)
            line += f"  B={stop}" if stop is not None else "  pays at every B measured"
        lines.append(line)
    return "\n".join(lines)
