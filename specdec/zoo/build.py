"""Building a zoo family from the standard library's source, offline and reproducibly:

1. a byte-level BPE tokenizer on the training files;
2. the target, a causal LM trained with a joint MTP loss: Qwen3's architecture, or Qwen3.5's
   hybrid layout (GatedDeltaNet linear attention and full attention at 3 : 1, one MTP module);
3. the family's learned drafters (a draft model, Medusa heads, an EAGLE-1 and an EAGLE-3 head, or
   those of them its settings name), distilled together from the frozen target; a draft model on
   a tokenizer of its own, trained on the text (`specdec.zoo.xtok`); and a retrieval datastore (a
   suffix array) of the training text; and the block drafters its settings name, DFlash and PARD,
   each trained alone from the frozen target (`specdec.zoo.parallel`);
4. the evaluation (held-out prompts and loss windows, `evaluation/`), every figure measured on it
   from the files just written (`specdec.zoo.measure`: losses, accepted lengths with intervals,
   loop shares, into `figures.json`), and each drafter's draft tax: one draft step's cost against
   one target forward (`specdec.zoo.costs`).

Each step is a call into `specdec.training`, the code `specdec train` runs on any target.
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from specdec.checkpoints import load_causal_lm, load_tokenizer, quiet_transformers
from specdec.data.corpus import Corpus, stdlib_corpus
from specdec.data.datastore_build import build_datastore_from_ids
from specdec.data.prompts import code_prompts
from specdec.drafters.feature_heads.eagle import save_eagle
from specdec.drafters.feature_heads.eagle3_files import save_eagle3
from specdec.drafters.feature_heads.eagle3_head import SPECULATORS
from specdec.drafters.feature_heads.medusa_files import save_medusa
from specdec.plugins import make_drafter
from specdec.runtime.target import CausalLM
from specdec.training.calibration import value_temperatures
from specdec.training.data import encode_corpus, evaluation_windows, training_texts
from specdec.training.distill import distill
from specdec.training.draft_model import DraftModelStudent
from specdec.training.eagle import EagleStudent
from specdec.training.eagle3 import Eagle3Student
from specdec.training.medusa import MedusaStudent
from specdec.training.mtp import MtpStudent, create_mtp_head, write_mtp
from specdec.training.target import new_target, train_target
from specdec.training.tokenizer import save_tokenizer, train_tokenizer
from specdec.versions import software_versions
from specdec.zoo.costs import draft_costs
from specdec.zoo.measure import Evaluation, measure, read_evaluation, write_evaluation
from specdec.zoo.options import zoo_drafters
from specdec.zoo.parallel import build_dflash, build_pard
from specdec.zoo.settings import FULL, LEARNED, TRAINING_FREE, VARIANTS, XTOK, ZooSettings
from specdec.zoo.store import CALIBRATION, MANIFEST, family_dir, ships, staging
from specdec.zoo.xtok import build_xtok

__all__ = ["build", "documents", "family_costs", "piece_entries"]

def build(settings: ZooSettings = FULL, root: str | Path | None = None, show_progress: bool = True,
          log: Callable[[str], None] | None = None) -> Path:
    """Build the family unless the cache holds it already; return its directory."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    with staging(settings, root) as work:
        if work is not None:
            say(f"building the {settings.name} zoo into {family_dir(settings, root)}")
            if ships(settings.name):
                say(f"(the {settings.name} family also ships with specdec; training is not bit-reproducible across "
                    "machines, so this build's figures may differ from the shipped family's)")
            _build_into(work, settings, show_progress, say)
    return family_dir(settings, root)


def _parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.iterdir() if f.is_file())


def _build_into(work: Path, settings: ZooSettings, show_progress: bool, say: Callable[[str], None]) -> None:
    """Every piece of the family into `work`, then its manifest; each stage's seconds are said and kept."""
    stages = _Stages(say)
    corpus = stdlib_corpus()
    say(f"corpus: {len(corpus.train)} training and {len(corpus.heldout)} held-out files from {corpus.root}")
    tokenizer, data = _tokenizer_and_data(work, settings, corpus, say)
    stages.done("tokenizer_and_data")
    eos = int(tokenizer.eos_token_id)
    target, mtp_head = _train_target(work, settings, tokenizer, data.train, show_progress)
    stages.done("target")
    students = _train_students(work, settings, target, tokenizer, data.train, show_progress)
    stages.done("students")
    sizes = {student.name: _parameters(student.module) for student in students} | {"mtp": _parameters(mtp_head)}
    if XTOK in settings.drafters:
        sizes[XTOK] = build_xtok(work, settings, corpus, show_progress, say)
        stages.done("draft_model_xtok")
    for name, build_piece in (("dflash", build_dflash), ("pard", build_pard)):
        if name in settings.drafters:
            sizes[name] = build_piece(work, settings, target, tokenizer, data.train, show_progress, say)
            stages.done(name)
    if "retrieval" in settings.drafters:
        say("datastore: a suffix array of the training text, for the retrieval drafter")
        build_datastore_from_ids(documents(data.train, eos), work / "datastore", tokenizer=tokenizer,
                                 sources=[str(corpus.root)])
        stages.done("datastore")
    say("evaluating on held-out text")
    windows = evaluation_windows(data.heldout, settings.target_steps.seq_len, settings.eval_windows)
    evaluation = Evaluation(code_prompts(corpus, per_category=settings.eval_prompts), windows, k=4,
                            new_tokens=settings.eval_new_tokens, temperature=settings.eval_temperature,
                            seed=settings.seed)
    write_evaluation(work, evaluation)
    learned = [*students, MtpStudent(mtp_head, target.get_input_embeddings(), target.get_output_embeddings())]
    temperatures = value_temperatures(target, learned, windows)
    (work / CALIBRATION).write_text(json.dumps(temperatures, indent=2, sort_keys=True) + "\n")
    stages.done("calibration")
    measure(work, settings.drafters, say)  # every figure from the files just written: figures.json
    stages.done("measures")
    say("measuring each drafter's draft tax" + (" on the compiled engine" if settings.cost_compiled else ""))
    costs = family_costs(work, settings, settings.drafters)
    stages.done("draft_tax")
    pieces = {"tokenizer": {"path": "tokenizer", "vocab_size": settings.vocab_size,
                            "bytes": _bytes(work / "tokenizer")},
              "target": {"path": "target", "parameters": _parameters(target), "bytes": _bytes(work / "target")}}
    pieces |= piece_entries(work, settings, settings.drafters, sizes, temperatures, costs)
    record = {"name": settings.name, "key": settings.key(), "settings": settings.record(),
              "build_seconds": stages.total(), "stage_seconds": stages.seconds,
              "threads": torch.get_num_threads(),
              "versions": software_versions(), "corpus": {"root": str(corpus.root), "train_files": data.train_files,
                                                  "heldout_files": data.heldout_files,
                                                  "train_tokens": int(data.train.shape[0]),
                                                  "heldout_tokens": int(data.heldout.shape[0])},
              "target_forward_seconds": costs["target_forward_seconds"],
              "costs": {"k": costs["k"], "compiled": costs["compiled"], "rounds": settings.cost_rounds},
              "pieces": pieces}
    (work / MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
    say(f"built in {record['build_seconds']:.0f} s")


class _Stages:
    """The seconds of each stage of a build, in order, each said as it ends."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.seconds: dict[str, float] = {}  # stage -> seconds, in the order the stages ended
        self.started = self.mark = time.perf_counter()

    def done(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self.mark, 1)
        self.mark = now
        self.say(f"  ({stage.replace('_', ' ')}: {self.seconds[stage]:.0f} s)")

    def total(self) -> float:
        return round(time.perf_counter() - self.started, 1)


def _tokenizer_and_data(work: Path, settings: ZooSettings, corpus: Corpus, say: Callable[[str], None]
                        ) -> tuple[Any, Any]:
    """The byte-level BPE tokenizer trained on the corpus (saved to work/tokenizer, then loaded), and
    the corpus encoded with it (training and held-out token streams)."""
    say(f"tokenizer: byte-level BPE, {settings.vocab_size} entries")
    save_tokenizer(train_tokenizer(training_texts(corpus, settings.tokenizer_chars), settings.vocab_size),
                   work / "tokenizer", settings.target.max_positions)
    tokenizer = load_tokenizer(work / "tokenizer")
    data = encode_corpus(tokenizer, corpus, int(tokenizer.eos_token_id), settings.train_chars, settings.heldout_chars)
    say(f"data: {data.train.shape[0]:,} training and {data.heldout.shape[0]:,} held-out tokens")
    return tokenizer, data


def _train_target(work: Path, settings: ZooSettings, tokenizer: Any, train: torch.Tensor, show_progress: bool
                  ) -> tuple[PreTrainedModel, Any]:
    """The target and its MTP head, trained together and saved to work/target with the tokenizer."""
    torch.manual_seed(settings.seed)
    target = new_target(settings.target, settings.vocab_size, int(tokenizer.eos_token_id))
    mtp_head = create_mtp_head(target.config, settings.seed + 1)
    train_target(target, mtp_head, train, settings.target_steps, show_progress)
    with tempfile.TemporaryDirectory(dir=work) as plain:  # the target's own files, then a copy with the MTP module
        with quiet_transformers():
            target.save_pretrained(plain)
        write_mtp(mtp_head, plain, work / "target")
    tokenizer.save_pretrained(str(work / "target"))
    return target, mtp_head


def _train_students(work: Path, settings: ZooSettings, target: PreTrainedModel, tokenizer: Any, train: torch.Tensor,
                    show_progress: bool) -> list[Any]:
    """The family's draft model, Medusa, EAGLE and EAGLE-3 students (LEARNED's order, those
    `settings.drafters` names), distilled from the target together and each saved in its own
    directory of `work`."""
    lr = settings.student_steps.lr
    create: dict[str, Callable[[], Any]] = {
        "draft-model": lambda: DraftModelStudent.create(settings.draft, target, settings.seed + 2, lr=lr),
        "medusa": lambda: MedusaStudent.create(settings.medusa_heads, settings.medusa_layers,
                                               target.get_output_embeddings(), settings.seed + 3, lr=lr),
        "eagle": lambda: EagleStudent.create(target, settings.seed + 4, lr=lr / 4),
        "eagle3": lambda: Eagle3Student.create(target, train, settings.seed + 5, lr=settings.eagle3_lr,
                                               draft_vocab=settings.eagle3_vocab, layers=settings.eagle3_layers)}
    students = [create[name]() for name in LEARNED if name in create and name in settings.drafters]
    if students:
        distill(target, students, train, settings.student_steps, show_progress)
    save: dict[str, Callable[[Any], None]] = {
        "draft-model": lambda module: _save_draft_model(module, tokenizer, work / "draft-model"),
        "medusa": lambda module: save_medusa(module, work / "medusa"),
        "eagle": lambda module: save_eagle(module, work / "eagle"),
        "eagle3": lambda module: save_eagle3(module, work / "eagle3", layout=SPECULATORS)}  # keeps norm_before_residual
    for student in students:
        save[student.name](student.module)
    return students


def _save_draft_model(module: PreTrainedModel, tokenizer: Any, directory: Path) -> None:
    with quiet_transformers():
        module.save_pretrained(directory)
    tokenizer.save_pretrained(str(directory))


def piece_entries(work: Path, settings: ZooSettings, labels: tuple[str, ...], sizes: dict[str, int],
                  temperatures: dict[str, float], costs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The manifest's entry for each drafter of `labels` (in the manifest's order: `LEARNED`'s, then
    `TRAINING_FREE`'s): where its files lie, its size and draft tax (its losses and accepted lengths
    are in figures.json)."""
    pieces: dict[str, dict[str, Any]] = {}
    for name in (name for name in LEARNED if name in labels):
        directory = "target" if name == "mtp" else name
        pieces[name] = {"path": directory, "parameters": sizes[name],
                        "bytes": _bytes(work / directory) if name != "mtp" else None}
        if name == XTOK:
            pieces[name]["vocab_size"] = len(load_tokenizer(work / XTOK))
        if name in temperatures:
            pieces[name]["value_temperature"] = temperatures[name]
    for name in (name for name in TRAINING_FREE if name in labels):
        pieces[name] = {"path": "datastore" if name == "retrieval" else None}
    for name in (name for name in VARIANTS if name in labels):
        pieces[name] = {"path": name.split("-k")[0]}  # another k of a piece the family has
    if "retrieval" in pieces:
        pieces["retrieval"]["bytes"] = _bytes(work / "datastore")
    for name, drafter_costs in costs["drafters"].items():
        pieces[name]["draft_cost"] = drafter_costs
    return pieces


def documents(stream: torch.Tensor, eos: int) -> list[list[int]]:
    """The files of an encoded stream [N] (each followed by `eos`), without the separators."""
    ids = stream.tolist()
    ends = [i for i, token in enumerate(ids) if token == eos]
    starts = [0] + [end + 1 for end in ends]
    return [ids[a:b] for a, b in zip(starts, [*ends, len(ids)]) if b > a]


def family_costs(directory: Path, settings: ZooSettings, labels: tuple[str, ...]) -> dict[str, Any]:
    """The draft tax (`specdec.zoo.costs.draft_costs`) of each zoo label of `labels` on the family's
    target, on the first two evaluation prompts."""
    target = CausalLM(load_causal_lm(directory / "target"))
    tokenizer = load_tokenizer(directory / "tokenizer")
    factories: dict[str, Callable[[], Any]] = {
        label: functools.partial(make_drafter, name, **options)
        for label, (name, options) in zoo_drafters(directory, labels).items()}
    prompts = [torch.tensor(tokenizer(p.text, add_special_tokens=False)["input_ids"])
               for p in read_evaluation(directory).prompts[:2]]
    return draft_costs(target, factories, prompts, k=4, new_tokens=min(64, settings.eval_new_tokens),
                       rounds=settings.cost_rounds, compile=settings.cost_compiled, tokenizer=tokenizer)
