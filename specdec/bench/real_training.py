"""Drafters trained for the real-model bench's target, SmolLM2-135M-Instruct, on 2 CPU cores in
about an hour, with nothing from a hub.

Stage 1 writes the training text: the target's own greedy answers to requests made from the
standard library's module summaries, through its chat template
(`specdec.training.chat_corpus`). Stages 2-4 train an EAGLE-3 head, Medusa heads and a draft
model distilled to about a tenth of the target's weights on that text (`specdec train`, one kind
at a time, each its own budget below). Each stage's seconds and each drafter's held-out figures
go to `training.json` beside the drafters, which `specdec bench-real --drafters DIR` then runs.

    specdec train-real --out trained          # what `make train-real` runs (specdec.cli.train_real)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdec.bench.real import prepared_target

__all__ = ["BUDGETS", "CORPUS", "CorpusBudget", "prepared_chat_corpus", "train_for_real"]

RECORD = "training.json"


@dataclass(frozen=True)
class CorpusBudget:
    """How much chat text the target writes: `requests` answers of up to `max_new_tokens`, `batch` at a time."""

    requests: int = 512
    max_new_tokens: int = 160
    batch: int = 32


CORPUS = CorpusBudget()


def _budgets() -> dict[str, Any]:
    from specdec.training.draft_model import DraftSize
    from specdec.training.optim import Steps
    from specdec.training.run import TrainSettings

    return {
        # A draft vocabulary of the 8,192 most frequent tokens: chat text stays inside it, and its
        # LM head is a sixth of the target's. About 5 s a step.
        "eagle3": TrainSettings(Steps(steps=240, batch=4, seq_len=256, lr=1e-3), draft_vocab=8192),
        # Four heads, each with its own copy of the 49,152-row LM head: the costliest step per token.
        "medusa": TrainSettings(Steps(steps=120, batch=4, seq_len=128, lr=1e-3), medusa_heads=4),
        # 256 wide, 4 layers: 15.7M weights (12.6M of them the tied embeddings), 12% of the target's.
        "draft-model": TrainSettings(Steps(steps=150, batch=8, seq_len=256, lr=2e-3),
                                     draft=DraftSize(hidden=256, layers=4, heads=4, kv_heads=2)),
    }


BUDGETS = tuple(_budgets())  # the kinds, in the order they train


def prepared_chat_corpus(target: Path, cache: Path | None = None, budget: CorpusBudget | None = None,
                         log: Callable[[str], None] = print) -> tuple[Path, float]:
    """The chat corpus of `budget` (None: CORPUS) for `target`, written once into the cache;
    (folder, seconds spent writing it now, 0 when it was there)."""
    from specdec.bench.real import cache_folder
    from specdec.checkpoints import load_causal_lm, load_tokenizer
    from specdec.training.chat_corpus import chat_requests, stdlib_subjects, write_chat_corpus

    budget = budget or CORPUS
    out = cache_folder(cache) / (f"chat-corpus-{target.name}-{budget.requests}x{budget.max_new_tokens}")
    if out.is_dir():
        return out, 0.0
    start = time.perf_counter()
    requests = chat_requests(stdlib_subjects(), budget.requests)
    model = load_causal_lm(target).float().eval()
    write_chat_corpus(model, load_tokenizer(target), requests, out, budget.max_new_tokens, budget.batch, log=log)
    seconds = time.perf_counter() - start
    log(f"wrote the chat corpus {out}: {budget.requests} answers in {seconds:.0f} s")
    return out, seconds


def train_for_real(out: Path, kinds: Sequence[str] = BUDGETS, cache: Path | None = None,
                   log: Callable[[str], None] = print, show_progress: bool = True) -> dict[str, object]:
    """Train `kinds` for SmolLM2 into out/KIND (a kind already there is kept, not retrained) and
    write out/training.json: the corpus, each stage's seconds and budget, each drafter's held-out
    figures. Returns that record."""
    from specdec.training.run import train_drafter

    unknown = [kind for kind in kinds if kind not in BUDGETS]
    if unknown:
        raise ValueError(f"no training budget for {', '.join(map(repr, unknown))}; choose from {', '.join(BUDGETS)}")
    target = prepared_target(cache, log)
    corpus, corpus_seconds = prepared_chat_corpus(target, cache, log=log)
    out.mkdir(parents=True, exist_ok=True)
    record_file = out / RECORD
    record = json.loads(record_file.read_text()) if record_file.is_file() else {"stages": {}}
    record.update({"target": str(target), "corpus": str(corpus), "corpus_budget": asdict(CORPUS)})
    if corpus_seconds:
        record["stages"]["corpus"] = {"seconds": round(corpus_seconds, 1)}
    budgets = _budgets()
    for kind in kinds:
        if (out / kind).is_dir():
            log(f"{out / kind} is there; kept")
            continue
        settings, start = budgets[kind], time.perf_counter()
        report = train_drafter(kind, target, [corpus], out / kind, settings, show_progress=show_progress, log=log)
        seconds = time.perf_counter() - start
        record["stages"][kind] = {"seconds": round(seconds, 1), "settings": asdict(settings), "heldout": report.heldout,
                                  "k": settings.k, "mean_accepted_length": report.mean_accepted_length,
                                  "acceptance_rate": report.acceptance_rate, "train_tokens": report.train_tokens}
        log(f"{kind}: {seconds / 60:.1f} min, held-out mean accepted length {report.mean_accepted_length:.2f} "
            f"(greedy, k = {settings.k})")
        record_file.write_text(json.dumps(record, indent=2) + "\n")
    record_file.write_text(json.dumps(record, indent=2) + "\n")
    return record
