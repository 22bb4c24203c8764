"""Adding drafters to a built family without building it again: `specdec zoo extend`.

Building a family trains every piece from scratch (the full one in about 45 minutes on 2 CPU cores), and training
is not bit-reproducible across machines, so building the shipped family again would change every
figure it publishes. When new settings only add drafters that train alone or need no training,
`extend` copies the family, trains only the missing pieces, measures only the new rows on the
family's stored evaluation, and merges them into its files; every file it had stays as it was.

1. The settings must be the family's own but for the added drafters (and the fields only they
   use, such as `xtok_vocab_size` and `xtok_steps`), and the family must hold its evaluation and figures.
2. Each added drafter is one of `EXTENDABLE`: `draft-model-xtok` (its tokenizer and model train on
   the text alone, `specdec.zoo.xtok`, on the standard library the family was built from), a block
   drafter (DFlash, PARD: each trains alone from the frozen target, `specdec.zoo.parallel`), a
   training-free drafter that needs no file (ngram, lookahead, suffix, self) or a variant row of a
   piece the family has (`eagle3-k15`). A distilled student trains together with the others, and
   retrieval needs its datastore: those need a build.
3. The new rows' figures: their held-out losses, each evaluation prompt decoded as `measure`
   decodes it (`decode_rows`), and their draft tax (`family_costs`). The mean accepted lengths,
   intervals and loop shares of the earlier rows are computed again from the per-prompt counts
   figures.json holds, so they stay as published; their ranks are taken again among all rows, as
   a fresh measurement would.
4. The manifest gains the new pieces and an `extensions` entry (what was added, when, how long it
   took, the versions, and the T(1) the new draft taxes divide by); its settings and key become the
   new settings'. The result is written as the new settings' family in the cache.

`extend_shipped` does it to a shipped family: unpacked with `open_shipped` under its recorded
settings, extended, and shipped again with `ship` (the files it shipped keep their stored bytes);
then the new rows are measured again on the shipped bytes (`measure_shipped_rows`), since a new
piece was measured as trained and ships in half precision.
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specdec.checkpoints import load_causal_lm, quiet_transformers
from specdec.versions import software_versions
from specdec.zoo.build import family_costs, piece_entries
from specdec.zoo.measure import (FIGURES, PromptRun, acceptance_figures, decode_rows, ordered, piece_losses,
                                 read_evaluation, read_figures, write_figures)
from specdec.zoo.packing import sha256
from specdec.zoo.parallel import build_dflash, build_pard
from specdec.zoo.settings import (LATER_FIELDS, LEARNED, PARALLEL, TRAINING_FREE, VARIANTS, XTOK, ZooSettings,
                                  settings_from_record)
from specdec.zoo.shipped import RECORD, SHIPPED, open_shipped, ship
from specdec.zoo.store import MANIFEST, family_dir, manifest, staging_into
from specdec.zoo.xtok import build_xtok

__all__ = ["EXTENDABLE", "added_drafters", "extend", "extend_shipped", "measure_rows", "measure_shipped_rows"]

EXTENDABLE = (XTOK, *PARALLEL, "ngram", "lookahead", "suffix", "self", *VARIANTS)
PIECE_FIELDS = {XTOK: ("xtok_vocab_size", "xtok_steps"), "dflash": ("dflash_layers", "dflash_steps"),
                "pard": ("pard_steps",)}  # settings only a piece uses, which may change as it is added


def added_drafters(record: dict[str, Any], settings: ZooSettings, directory: Path) -> tuple[str, ...]:
    """The drafters `settings` adds to the family whose manifest is `record`, in the settings'
    order; ValueError (one line, naming the value) when `settings` differ otherwise, or drop one."""
    old = settings_from_record(record["settings"])
    if old.name != settings.name:
        raise ValueError(f"{directory} holds the {old.name} family, not {settings.name}: extend a family with its "
                         "own settings")
    dropped = [name for name in old.drafters if name not in settings.drafters]
    if dropped:
        raise ValueError(f"extending {directory} cannot drop {', '.join(dropped)}: build the family again")
    added = tuple(name for name in settings.drafters if name not in old.drafters)
    own = {field for name in added for field in PIECE_FIELDS.get(name, ())}
    before, after = old.record(), settings.record()
    for field in sorted((set(before) | set(after)) - {"drafters"} - own):
        if before.get(field, LATER_FIELDS.get(field)) != after.get(field, LATER_FIELDS.get(field)):
            raise ValueError(f"extending {directory}: its {field} is {before.get(field)!r}, the new settings' "
                             f"{after.get(field)!r}; only added drafters may differ: build the family again")
    refused = [name for name in added if name not in EXTENDABLE]
    if refused:
        raise ValueError(f"cannot add {', '.join(refused)} to the built family at {directory}: only "
                         f"{', '.join(EXTENDABLE)} train alone or need no file; build the family again")
    return added


def extend(directory: Path, settings: ZooSettings, root: str | Path | None = None, show_progress: bool = True,
           say: Callable[[str], None] | None = None) -> Path:
    """The family at `directory` with the drafters `settings` adds (see the module docstring),
    written as the family of `settings` in the cache (`family_dir(settings, root)`); its directory.
    A family that already has them is returned as it is."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    record = manifest(directory)
    if record["key"] == settings.key():
        return directory
    added = added_drafters(record, settings, directory)
    read_evaluation(directory)  # FileNotFoundError naming the directory when it has none
    if read_figures(directory) is None:
        raise FileNotFoundError(f"{directory} holds no {FIGURES}: measure it first (`specdec.zoo.measure`)")
    if not added:  # the same drafters in another order
        raise ValueError(f"{directory} already has every drafter of these settings ({', '.join(settings.drafters)}) "
                         "in another order: build the family again")
    with staging_into(family_dir(settings, root)) as work:
        if work is not None:
            say(f"extending the {settings.name} zoo at {directory} with {', '.join(added)}")
            shutil.copytree(directory, work, dirs_exist_ok=True)
            _extend_into(work, settings, record, added, show_progress, say)
    return family_dir(settings, root)


def _extend_into(work: Path, settings: ZooSettings, record: dict[str, Any], added: tuple[str, ...],
                 show_progress: bool, say: Callable[[str], None]) -> None:
    """The new pieces trained into `work` (a copy of the family), their figures merged into its
    figures.json, and its manifest rewritten (last: it marks the family complete)."""
    began = time.perf_counter()
    stages: dict[str, float] = {}
    sizes: dict[str, int] = {}
    if XTOK in added:
        sizes[XTOK] = build_xtok(work, settings, _family_corpus(record), show_progress, say)
        stages["draft_model_xtok"] = round(time.perf_counter() - began, 1)
    parallel = [name for name in PARALLEL if name in added]
    if parallel:
        from specdec.checkpoints import load_tokenizer
        from specdec.training.data import encode_corpus

        tokenizer = load_tokenizer(work / "tokenizer")
        data = encode_corpus(tokenizer, _family_corpus(record), int(tokenizer.eos_token_id), settings.train_chars,
                             settings.heldout_chars)
        with quiet_transformers():
            target = load_causal_lm(work / "target").eval()
        build = {"dflash": build_dflash, "pard": build_pard}
        for name in parallel:
            mark = time.perf_counter()
            sizes[name] = build[name](work, settings, target, tokenizer, data.train, show_progress, say)
            stages[name] = round(time.perf_counter() - mark, 1)
    mark = time.perf_counter()
    measure_rows(work, added, say)
    stages["measures"] = round(time.perf_counter() - mark, 1)
    mark = time.perf_counter()
    costs = family_costs(work, settings, added)
    for entry in costs["drafters"].values():
        entry["target_forward_seconds"] = costs["target_forward_seconds"]  # this run's T(1), not the build's
    stages["draft_tax"] = round(time.perf_counter() - mark, 1)
    pieces = record["pieces"] | piece_entries(work, settings, added, sizes, {}, costs)
    order = ["tokenizer", "target", *LEARNED, *TRAINING_FREE, *VARIANTS]
    extension = {"added": list(added), "seconds": round(time.perf_counter() - began, 1), "stage_seconds": stages,
                 "threads": torch.get_num_threads(), "versions": software_versions(),
                 "target_forward_seconds": costs["target_forward_seconds"], "from_key": record["key"]}
    merged = {**record, "key": settings.key(), "settings": settings.record(),
              "pieces": {name: pieces[name] for name in order if name in pieces},
              "extensions": [*record.get("extensions", []), extension]}
    (work / MANIFEST).write_text(json.dumps(merged, indent=2) + "\n")
    say(f"extended in {extension['seconds']:.0f} s")


def measure_rows(directory: Path, labels: tuple[str, ...], say: Callable[[str], None]) -> dict[str, Any]:
    """Measure the rows of `labels` on the family at `directory` as `measure` would (their held-out
    losses and every evaluation prompt decoded) and merge them into its figures.json, replacing any
    earlier figures of theirs; every other row keeps its figures (checked) and takes its rank again
    among all rows. The document written."""
    evaluation = read_evaluation(directory)
    with quiet_transformers():
        model = load_causal_lm(directory / "target").eval()
    figures = read_figures(directory)
    if figures is None:
        raise FileNotFoundError(f"{directory} holds no {FIGURES}: measure it first (`specdec.zoo.measure`)")
    losses = figures["losses"] | piece_losses(directory, model, evaluation, [n for n in labels if n in LEARNED])
    _, new_runs = decode_rows(directory, model, evaluation, labels, say, plain=False)
    runs = {label: [PromptRun(*row) for row in entry["prompts"]] for label, entry in figures["drafters"].items()}
    runs |= new_runs
    drafters = acceptance_figures({label: runs[label] for label in ordered(runs)})
    _say_ranks({label: entry for label, entry in figures["drafters"].items() if label not in labels}, drafters, say)
    document = {**figures, "losses": {name: losses[name] for name in ["target", *LEARNED] if name in losses},
                "drafters": drafters}
    write_figures(directory, document)
    return document


def _family_corpus(record: dict[str, Any]) -> Any:
    """This interpreter's standard library, when it is the one the family was built from (a new
    piece must train on the family's text); ValueError otherwise."""
    from specdec.data.corpus import stdlib_corpus

    corpus = stdlib_corpus()
    built = record["corpus"]
    python = record["versions"]["python"]
    if (len(corpus.train), len(corpus.heldout)) != (built["train_files"], built["heldout_files"]) or \
            python != platform.python_version():
        raise ValueError(f"the {record['name']} family was built from the standard library of Python {python} "
                         f"({built['train_files']} training files), this is Python {platform.python_version()} "
                         f"({len(corpus.train)}): its new pieces would train on other text")
    return corpus


def _say_ranks(before: dict[str, Any], after: dict[str, Any], say: Callable[[str], None]) -> None:
    """Check that every earlier row's figures are unchanged but for its rank, and say the ranks that moved."""
    for label, entry in before.items():
        kept = {key: value for key, value in after[label].items() if key != "rank"}
        if kept != {key: value for key, value in entry.items() if key != "rank"}:
            raise RuntimeError(f"extending changed the {label} row's figures; report it")
    moved = [f"{label} {entry['rank']} -> {after[label]['rank']}" for label, entry in before.items()
             if entry["rank"] != after[label]["rank"]]
    if moved:
        say("ranks among all rows: " + ", ".join(moved))


def extend_shipped(settings: ZooSettings, source: Path = SHIPPED, root: str | Path | None = None,
                   show_progress: bool = True, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Extend the shipped family `settings` names (in `source`) to `settings` and ship it again;
    the new shipped record. Raises when a file it shipped (but the manifest) changed."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    folder = source / settings.name
    if not (folder / RECORD).is_file():
        raise FileNotFoundError(f"no shipped {settings.name} family in {source} (no {RECORD})")
    before = json.loads((folder / RECORD).read_text())
    stored = {entry["stored"]: entry["stored_sha256"] for entry in before["files"].values()
              if entry["stored"] != MANIFEST}  # the manifest gains the new pieces
    unpacked = open_shipped(settings_from_record(before["settings"]), root, source, say=say)
    extended = extend(unpacked, settings, root, show_progress, say)
    if extended == unpacked:
        say(f"the shipped {settings.name} family already has every drafter of these settings")
        return before
    after = ship(extended, folder, say)
    changed = [name for name, digest in stored.items()
               if not (folder / name).is_file() or sha256(folder / name) != digest]
    if changed:
        raise RuntimeError(f"shipping the extended {settings.name} family changed files it shipped: "
                           f"{', '.join(changed)}; restore them (git checkout -- {folder}) and report it")
    added = tuple(name for name in settings.drafters if name not in before["settings"]["drafters"])
    measure_shipped_rows(settings, added, source, root, say)
    return after


def measure_shipped_rows(settings: ZooSettings, labels: tuple[str, ...], source: Path = SHIPPED,
                         root: str | Path | None = None, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The rows of `labels` measured again on the shipped family's bytes (`measure_rows` on it, as
    `open_shipped` unpacks it) and its committed figures.json rewritten: the extension measured
    them on the weights as trained, and a family's figures are those of the weights as shipped
    (half precision, `specdec.zoo.shipped`), as `make docs-figures` measures a build."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    directory = open_shipped(settings, root, source, say=say)
    say(f"measuring {', '.join(labels)} on the shipped {settings.name} zoo's bytes")
    document = measure_rows(directory, labels, say)
    shutil.copyfile(directory / FIGURES, source / settings.name / FIGURES)
    return document
