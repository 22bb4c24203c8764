"""`specdec train`: one drafter for any transformers causal LM, from any text files.

The target is frozen; the drafter learns the target's own distributions over the text
(self-distillation), and the result is measured on held-out files by decoding with it. The
checkpoint is written in the format its drafter loads, into a staging directory renamed to
`out` only when complete. Under torchrun each process trains on its share of every step's batch
(DistributedDataParallel: gloo on CPU, NCCL on GPUs), which trains the drafter one process
would train on the same data and seed; rank 0 alone measures it and writes `out`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdec.checkpoints import load_causal_lm, load_tokenizer, quiet_transformers
from specdec.data.corpus import files_corpus
from specdec.distributed.sharding import agree_object, is_main_process, rank_zero_first
from specdec.drafters.feature_heads.eagle import save_eagle
from specdec.drafters.feature_heads.eagle3_files import save_eagle3
from specdec.drafters.feature_heads.eagle3_head import SPECULATORS
from specdec.drafters.feature_heads.medusa_files import save_medusa
from specdec.drafters.parallel.dflash_files import save_dflash
from specdec.plugins import make_drafter
from specdec.training.data import encode_corpus, evaluation_windows
from specdec.training.dflash import DFlashStudent
from specdec.training.distill import distill, evaluate
from specdec.training.draft_model import DraftModelStudent, DraftSize
from specdec.training.eagle import EagleStudent
from specdec.training.eagle3 import Eagle3Student
from specdec.training.estimate import acceptance_estimate, prompt_windows
from specdec.training.medusa import MedusaStudent
from specdec.training.mtp import MtpStudent, write_mtp
from specdec.training.optim import Steps
from specdec.training.pard import PardRecipe, PardStudent, save_pard

__all__ = ["KINDS", "TrainReport", "TrainSettings", "train_drafter"]

KINDS = ("draft-model", "medusa", "eagle", "eagle3", "mtp", "dflash", "pard")
DEFAULT_LR = {"draft-model": 2e-3, "medusa": 1e-3, "eagle": 1e-3, "eagle3": 1e-3, "mtp": 1e-3, "dflash": 6e-4,
              "pard": 2e-3}
REPORT = "specdec_training.json"


@dataclass(frozen=True)
class TrainSettings:
    """What `train_drafter` trains and how; `lr=None` takes the kind's default."""

    steps: Steps
    draft: DraftSize = field(default_factory=DraftSize)
    medusa_heads: int = 4
    medusa_layers: int = 1
    draft_from_target: bool = True  # draft-model: embeddings start from the target's (projected)
    draft_vocab: int | None = None  # eagle3: tokens in the draft vocabulary (None: min(V, 32000))
    eagle3_layers: tuple[int, ...] | None = None  # eagle3: target layers read (None: EAGLE-3's default)
    dflash_block_size: int = 16  # dflash: B, the last committed id and B - 1 masks
    dflash_layers: int = 2  # dflash: draft layers
    dflash_target_layers: tuple[int, ...] | None = None  # dflash: target layer outputs fused (None: spread)
    dflash_gamma: float | None = None  # dflash: the slot weights' decay (None: 7 for B = 16, scaled)
    dflash_mask_token_id: int | None = None  # dflash: None: an id the tokenizer never produces
    dflash_anchors: int = 512  # dflash: blocks per training window, at most
    dflash_heads: int | None = None  # dflash: attention heads, each with its own keys/values (None: the target's)
    pard: PardRecipe = field(default_factory=PardRecipe)  # pard: blocks and the conditional drop
    pard_init: str | None = None  # pard: start from this causal LM (None: a fresh draft model of `draft`)
    eval_windows: int = 16
    eval_prompts: int = 4
    eval_prompt_tokens: int = 64
    eval_new_tokens: int = 64
    k: int = 4


@dataclass(frozen=True)
class TrainReport:
    """Where the drafter went and how it does on held-out text."""

    out: Path
    heldout: dict[str, float]  # the student's held-out figures (loss, agreement, per depth)
    mean_accepted_length: float  # greedy, k tokens per draft, on held-out prompts
    acceptance_rate: float
    train_tokens: int
    heldout_tokens: int


def _student(kind: str, target: Any, settings: TrainSettings, data: torch.Tensor, tokenizer: Any) -> Any:
    seed, lr = settings.steps.seed, settings.steps.lr
    if kind == "draft-model":
        return DraftModelStudent.create(settings.draft, target, seed, lr, from_target=settings.draft_from_target)
    if kind == "medusa":
        return MedusaStudent.create(settings.medusa_heads, settings.medusa_layers, target.get_output_embeddings(),
                                    seed, lr)
    if kind == "eagle":
        return EagleStudent.create(target, seed, lr)
    if kind == "eagle3":
        return Eagle3Student.create(target, data, seed, lr, settings.draft_vocab, settings.eagle3_layers)
    if kind == "dflash":
        return DFlashStudent.create(target, seed, lr, tokenizer=tokenizer, mask_token_id=settings.dflash_mask_token_id,
                                    block_size=settings.dflash_block_size, layers=settings.dflash_layers,
                                    target_layer_ids=settings.dflash_target_layers, gamma=settings.dflash_gamma,
                                    anchors=settings.dflash_anchors, heads=settings.dflash_heads)
    if kind == "pard":
        return PardStudent.create(settings.draft, target, tokenizer, seed, lr, from_target=settings.draft_from_target,
                                  init=settings.pard_init, recipe=settings.pard)
    return MtpStudent.create(target, seed, lr)


def _save(kind: str, student: Any, target_dir: Path, tokenizer: Any, out: Path) -> dict[str, Any]:
    """Write the checkpoint into `out`; returns the make_drafter options that load it."""
    if kind == "draft-model":
        with quiet_transformers():
            student.module.save_pretrained(out)
        tokenizer.save_pretrained(str(out))
        return {"model": str(out)}
    if kind == "pard":
        return save_pard(student, tokenizer, out)
    if kind == "medusa":
        save_medusa(student.module, out)
        return {"path": str(out)}
    if kind == "eagle":
        save_eagle(student.module, out)
        return {"path": str(out)}
    if kind == "eagle3":  # the layout that keeps norm_before_residual, which vLLM serves as it is
        save_eagle3(student.module, out, layout=SPECULATORS)
        return {"path": str(out)}
    if kind == "dflash":  # the published z-lab layout, which vLLM and SGLang load
        save_dflash(student.module, out)
        return {"path": str(out)}
    write_mtp(student.module, target_dir, out)  # the MTP module lives in a copy of the target's files
    return {"path": str(out)}


def train_drafter(kind: str, target_dir: str | Path, data: Sequence[str | Path], out: str | Path,
                  settings: TrainSettings, show_progress: bool = True,
                  log: Callable[[str], None] = print) -> TrainReport:
    """Train a `kind` drafter for the target at `target_dir` on `data` and save it to `out`.

    Raises ValueError for an unknown kind, FileExistsError when `out` is a non-empty directory.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown drafter kind {kind!r}; choose from {', '.join(KINDS)}")
    target_dir, out = Path(target_dir), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--out {str(out)!r} exists and is not an empty directory; choose a new one")
    corpus = files_corpus(data)
    target = load_causal_lm(target_dir).float()
    tokenizer = load_tokenizer(target_dir)
    tokens = encode_corpus(tokenizer, corpus, tokenizer.eos_token_id)
    log(f"data: {tokens.train.shape[0]:,} training tokens from {tokens.train_files} files, "
        f"{tokens.heldout.shape[0]:,} held-out tokens from {max(1, tokens.heldout_files)} file(s)")
    if tokens.heldout.shape[0] < 16:
        raise ValueError(f"the held-out text has {tokens.heldout.shape[0]} tokens, too few to measure the drafter; "
                         "pass more data (1/16 of the files are held out)")
    length = min(settings.steps.seq_len, tokens.heldout.shape[0] // 2)  # held-out windows and prompts fit
    windows = evaluation_windows(tokens.heldout, length, settings.eval_windows)
    prompts = prompt_windows(tokens.heldout, settings.eval_prompts, min(settings.eval_prompt_tokens, length))
    student = _student(kind, target, settings, tokens.train, tokenizer)
    distill(target, [student], tokens.train, settings.steps, show_progress)
    with rank_zero_first():  # under torchrun, rank 0 measures and writes; the others take its report
        report = _finish(kind, student, target, target_dir, tokenizer, tokens, windows, prompts, settings, data,
                         out) if is_main_process() else None
    return agree_object(report)


def _finish(kind: str, student: Any, target: Any, target_dir: Path, tokenizer: Any, tokens: Any, windows: torch.Tensor,
            prompts: Any, settings: TrainSettings, data: Sequence[str | Path], out: Path) -> TrainReport:
    """Measure the trained student on the held-out text and write it to `out`, atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        options = _save(kind, student, target_dir, tokenizer, staging)
        figures = evaluate(target, [student], windows)
        stats = acceptance_estimate(target, lambda: make_drafter(kind, **options), prompts, settings.k,
                                    settings.eval_new_tokens)
        report = TrainReport(out, figures[student.name], stats.mean_accepted_length, stats.acceptance_rate,
                             int(tokens.train.shape[0]), int(tokens.heldout.shape[0]))
        record = {"kind": kind, "target": str(target_dir), "data": [str(p) for p in data],
                  "settings": asdict(settings), "heldout": report.heldout,
                  "mean_accepted_length": report.mean_accepted_length, "acceptance_rate": report.acceptance_rate,
                  "k": settings.k, "train_tokens": report.train_tokens, "heldout_tokens": report.heldout_tokens}
        (staging / REPORT).write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():
            out.rmdir()  # empty, checked above; fails if another run filled it meanwhile
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report
