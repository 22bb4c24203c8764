"""The zoo that ships with specdec: the full and hybrid families' trained files, versioned with
the code, so every machine decodes with the same bytes and prints the same accepted lengths.

Training is not bit-reproducible across machines (CPUs round differently and a thousand steps
amplify it), so a family trained on two machines differs; the families the docs describe are
therefore not rebuilt on first use but stored in `specdec/zoo/shipped-families/<family>/`:

- each weight file in half precision: every float32 tensor whose half-precision round trip is
  finite and keeps each nonzero entry nonzero is stored as float16, any other stays float32 (the
  published figures are measured on the weights as shipped, so the rounding is part of the zoo);
- every other file as it is (configs, tokenizer, evaluation prompts and windows, value
  temperatures, manifest, figures), a file the family holds twice (its tokenizer) once;
- the retrieval datastore as its recipe: the fingerprint of the training files (the standard
  library of the Python the zoo was built on) from which it is rebuilt in seconds, and the
  checksums the rebuilt files must have;
- `shipped.json`: each stored file's SHA-256, and a digest of each file's contents as unpacked.

`open_shipped` unpacks a family into the zoo cache once (float32 weights again, the layout a build
writes, so every loader reads it unchanged) and, on every call, verifies the stored files and the
unpacked copy against `shipped.json`: a stored file that differs is an error naming it; an
unpacked copy that differs is unpacked again. `ship` turns a built family into the stored form.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdec.data.datastore import SUFFIXES, TOKENS
from specdec.zoo.build import build, documents
from specdec.zoo.measure import FIGURES
from specdec.zoo.options import UNAVAILABLE, unavailable
from specdec.zoo.packing import content_digest, corpus_fingerprint, pack_weights, sha256, unpack_weights
from specdec.zoo.settings import ZOO_FORMAT, ZooSettings, family
from specdec.zoo.store import (MANIFEST, PIECES, SHIPPED, SHIPPED_RECORD, cache_root, family_dir, shipped_names,
                                staging_into)

__all__ = ["RECORD", "SHIPPED", "ZooIntegrityError", "open_shipped", "piece_dir", "ready",
           "ship", "shipped_names"]

RECORD = SHIPPED_RECORD
DATASTORE_BINS = (TOKENS, SUFFIXES)
SHIP_FORMAT = 1


class ZooIntegrityError(ValueError):
    """A shipped zoo file does not hold the bytes its checksum says."""


def _stdlib_fingerprint() -> str:
    from specdec.data.corpus import stdlib_corpus

    corpus = stdlib_corpus()
    return corpus_fingerprint([(corpus.relative(p), p.read_bytes()) for p in corpus.train])


def ship(built: Path, out: Path, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Store the finished family at `built` in `out` in the shipped form (written beside `out`,
    then renamed into its place); its record. The build must be of this code's settings for its
    family, and its datastore must be what this interpreter's standard library rebuilds."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    manifest = json.loads((built / MANIFEST).read_text())
    settings = family(manifest["name"])
    if manifest["key"] != settings.key():
        raise ValueError(f"{built} was built by other settings or another ZOO_FORMAT than this code's "
                         f"{settings.name} family ({manifest['key']} against {settings.key()}); build it again")
    work = out.parent / f".{out.name}.partial"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        before = json.loads((out / RECORD).read_text())["files"] if (out / RECORD).is_file() else {}
        record = _store(built, work, manifest, tuple(before))
        if "datastore" in record:  # the recipe must rebuild what was built
            check = work / ".check"
            shutil.copytree(built / "tokenizer", check / "tokenizer")
            (check / "datastore").mkdir()
            reason = _rebuild_datastore(check, record)
            shutil.rmtree(check)
            if reason is not None:
                raise ValueError(f"cannot ship {built}: {reason}")
        (work / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    stored = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    unpacked = sum(f.stat().st_size for f in built.rglob("*") if f.is_file())
    say(f"shipped {manifest['name']} into {out}: {stored / 1e6:.2f} MB stored ({unpacked / 1e6:.2f} MB built); "
        "measure it as shipped next: `make docs-figures`")
    return record


def _store(built: Path, out: Path, manifest: dict[str, Any], shipped_before: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every file of `built` into `out` (weights halved, duplicates once, the suffix arrays left
    to the recipe); the record, each file's digest taken as it will unpack. The files of
    `shipped_before` (the family's earlier shipping) come first, so a duplicate keeps the stored
    copy it had."""
    files: dict[str, dict[str, Any]] = {}
    stored_by_digest: dict[str, str] = {}
    datastore = built / "datastore"
    earlier = set(shipped_before)
    names = sorted((p.relative_to(built).as_posix() for p in built.rglob("*") if p.is_file()),
                   key=lambda name: (name not in earlier, name))
    for name in names:
        path = built / name
        if path.parent == datastore and path.name in DATASTORE_BINS:
            continue  # rebuilt from the recipe
        if name == FIGURES:
            shutil.copyfile(path, out / FIGURES)  # measured from the files, not part of them: `make docs-figures`
            continue
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".safetensors":
            entry: dict[str, Any] = {"halved": pack_weights(path, target), "stored": name}
            round_trip = out / ".round-trip.safetensors"
            unpack_weights(target, round_trip, entry["halved"])
            entry["digest"] = content_digest(round_trip)  # what unpacking gives, not the float32 build
            round_trip.unlink()
        else:
            entry = {"digest": content_digest(path)}
            if entry["digest"] in stored_by_digest:
                entry["stored"] = stored_by_digest[entry["digest"]]  # the same bytes, stored once
            else:
                shutil.copyfile(path, target)
                entry["stored"] = stored_by_digest[entry["digest"]] = name
        files[name] = entry
    for entry in files.values():
        entry["stored_sha256"] = sha256(out / entry["stored"])
    record: dict[str, Any] = {"format": SHIP_FORMAT, "family": manifest["name"], "key": manifest["key"],
                              "zoo_format": ZOO_FORMAT, "settings": manifest["settings"],
                              "python": manifest["versions"]["python"], "files": files}
    if datastore.is_dir():
        record["datastore"] = {"train_chars": manifest["settings"]["train_chars"],
                               "heldout_chars": manifest["settings"]["heldout_chars"],
                               "corpus": _stdlib_fingerprint(),
                               "files": {name: sha256(datastore / name) for name in DATASTORE_BINS}}
    return record


def _record(folder: Path) -> dict[str, Any]:
    file = folder / RECORD
    if not file.is_file():
        raise FileNotFoundError(f"{folder} holds no shipped zoo ({RECORD}); the families that ship: "
                                f"{', '.join(shipped_names()) or 'none'}")
    return json.loads(file.read_text())


def _verify_stored(folder: Path, record: dict[str, Any]) -> None:
    """Every stored file's SHA-256 against the record; ZooIntegrityError naming the first that differs."""
    for stored in sorted({entry["stored"]: entry["stored_sha256"] for entry in record["files"].values()}.items()):
        name, expected = stored
        path = folder / name
        if not path.is_file():
            raise ZooIntegrityError(f"the shipped {record['family']} zoo lacks {path}; restore it from the "
                                    "repository (git checkout -- specdec/zoo/shipped-families) or build one with "
                                    "`specdec zoo build`")
        found = sha256(path)
        if found != expected:
            raise ZooIntegrityError(
                f"the shipped {record['family']} zoo's {path} has SHA-256 {found[:16]}…, not the {expected[:16]}… "
                f"{RECORD} records: the file was changed or truncated (a Git LFS pointer, a partial checkout). "
                "Restore it from the repository (git checkout -- specdec/zoo/shipped-families), or build your own "
                "family with `specdec zoo build` (its figures may differ from the shipped ones)")


def _unpacked_matches(directory: Path, record: dict[str, Any]) -> str | None:
    """None when the unpacked copy holds every file with its recorded contents, else what differs."""
    for name, entry in record["files"].items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if content_digest(path) != entry["digest"]:
            return f"{name} differs"
    if "datastore" in record and "retrieval" not in unavailable(directory):
        for name, expected in record["datastore"]["files"].items():
            path = directory / "datastore" / name
            if not path.is_file() or sha256(path) != expected:
                return f"datastore/{name} differs"
    return None


def ready(settings: ZooSettings, root: str | Path | None = None, show_progress: bool = True, built: bool = False,
          say: Callable[[str], None] | None = None) -> Path:
    """The family to decode with: the shipped files when `settings` names a family that ships
    (unpacked and verified, `open_shipped`), else, or with `built`, a local build of `settings`
    (trained now when the cache lacks it, `specdec.zoo.build`)."""
    if not built and settings.name in shipped_names():
        return open_shipped(settings, root, say=say)
    return build(settings, root, show_progress, log=say)


def piece_dir(settings: ZooSettings, piece: str, root: str | Path | None = None, built: bool = False) -> Path:
    """The directory of one piece of a family: of the shipped files when it ships (unless `built`),
    else of its local build, which must exist (FileNotFoundError saying how to build it)."""
    if piece not in PIECES:
        raise ValueError(f"unknown zoo piece {piece!r}; choose from {', '.join(PIECES)}")
    if not built and settings.name in shipped_names():
        directory = open_shipped(settings, root)
    else:
        directory = family_dir(settings, root)
        if not (directory / MANIFEST).is_file():
            raise FileNotFoundError(f"the {settings.name} zoo is not built under {cache_root(root)}; run "
                                    f"`specdec zoo build{_flags(settings)}`")
    if not (directory / PIECES[piece]).is_dir():
        raise FileNotFoundError(f"the {settings.name} zoo has no {piece} (its drafters: "
                                f"{', '.join(settings.drafters)})")
    if piece == "datastore" and "retrieval" in unavailable(directory):
        raise FileNotFoundError(f"the {settings.name} zoo's datastore is not available here: "
                                f"{unavailable(directory)['retrieval']}")
    return directory / PIECES[piece]


def open_shipped(settings: ZooSettings, root: str | Path | None = None, source: Path = SHIPPED,
                 say: Callable[[str], None] | None = None) -> Path:
    """The shipped family `settings` names, unpacked into the zoo cache and verified; its directory."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    folder = source / settings.name
    record = _record(folder)
    if record.get("format") != SHIP_FORMAT:
        raise ZooIntegrityError(f"the shipped {settings.name} zoo is in shipping format {record.get('format')}, this "
                                f"code reads {SHIP_FORMAT}: restore specdec/zoo/shipped-families from the "
                                "code's revision")
    if record["settings"] != settings.record() or record["zoo_format"] != ZOO_FORMAT:
        raise ZooIntegrityError(
            f"the shipped {settings.name} zoo was built with other settings (ZOO_FORMAT {record['zoo_format']}, "
            f"this code's {ZOO_FORMAT}): ship it again from a build of these settings (`specdec zoo build"
            f"{_flags(settings)}`, then `specdec zoo ship{_flags(settings)}`), or use a local build (`--built`)")
    _verify_stored(folder, record)
    digest = hashlib.sha256((folder / RECORD).read_bytes()).hexdigest()[:12]
    final = cache_root(root) / f"{settings.name}-shipped-{digest}"
    if (final / MANIFEST).is_file():
        problem = _unpacked_matches(final, record)
        if problem is None:
            _copy_figures(folder, final)
            return final
        say(f"the unpacked shipped {settings.name} zoo in {final} was changed ({problem}); unpacking it again")
        aside = final.parent / f".{final.name}.changed-{os.getpid()}"
        final.rename(aside)  # atomically out of the way of other readers, then removed
        shutil.rmtree(aside, ignore_errors=True)
    with staging_into(final) as work:
        if work is not None:
            _unpack(folder, record, work, say)
    _copy_figures(folder, final)
    return final


def _flags(settings: ZooSettings) -> str:
    """The `specdec zoo` flags that name the family."""
    hybrid = " --hybrid" if settings.name.startswith("hybrid") else ""
    return hybrid + (" --quick" if "quick" in settings.name else "")


def _copy_figures(folder: Path, directory: Path) -> None:
    """The shipped figures.json (measured from the shipped files) beside the unpacked ones."""
    source, copy = folder / FIGURES, directory / FIGURES
    if source.is_file() and (not copy.is_file() or copy.read_bytes() != source.read_bytes()):
        shutil.copyfile(source, copy)


def _unpack(folder: Path, record: dict[str, Any], work: Path, say: Callable[[str], None]) -> None:
    """Every file of the record into `work` (weights back in float32), the datastore rebuilt; the
    manifest last, since it marks the copy complete."""
    say(f"unpacking the shipped {record['family']} zoo into the cache")
    files = record["files"]
    for name, entry in sorted(files.items(), key=lambda item: item[0] == MANIFEST):
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if "halved" in entry:
            unpack_weights(folder / entry["stored"], path, entry["halved"])
        else:
            shutil.copyfile(folder / entry["stored"], path)
        if content_digest(path) != entry["digest"]:
            raise ZooIntegrityError(f"unpacking the shipped {record['family']} zoo's {name} gave other contents "
                                    "than it was shipped with; report it, with `pip freeze`")
    if "datastore" in record:
        reason = _rebuild_datastore(work, record)
        if reason is not None:
            say(f"retrieval is left out: {reason}")
            (work / UNAVAILABLE).write_text(json.dumps({"retrieval": reason}, indent=1) + "\n")


def _rebuild_datastore(work: Path, record: dict[str, Any]) -> str | None:
    """The datastore's suffix arrays rebuilt from this interpreter's standard library with the
    shipped tokenizer, checked against the record, then moved into `work/datastore`; None, or why
    they cannot be rebuilt here (then nothing is moved)."""
    import platform

    from specdec.checkpoints import load_tokenizer
    from specdec.data.corpus import stdlib_corpus
    from specdec.data.datastore_build import build_datastore_from_ids
    from specdec.training.data import encode_corpus

    recipe = record["datastore"]
    scratch = work / ".datastore"
    try:
        if _stdlib_fingerprint() != recipe["corpus"]:
            return (f"the datastore is rebuilt from the standard library of Python {record['python']}, and this "
                    f"Python {platform.python_version()}'s differs; build a family here with `specdec zoo build`")
        tokenizer = load_tokenizer(work / "tokenizer")
        eos = int(tokenizer.eos_token_id)
        data = encode_corpus(tokenizer, stdlib_corpus(), eos, recipe["train_chars"], recipe["heldout_chars"])
        build_datastore_from_ids(documents(data.train, eos), scratch, tokenizer=tokenizer)
        differ = [name for name, expected in recipe["files"].items() if sha256(scratch / name) != expected]
        if differ:
            return (f"the datastore rebuilt here differs from the shipped one ({', '.join(differ)}); report it, "
                    "with `pip freeze`")
        for name in recipe["files"]:
            (scratch / name).replace(work / "datastore" / name)
        return None
    except (OSError, ValueError) as error:  # no sources here, an unreadable file, a datastore error
        return f"the datastore could not be rebuilt here: {error}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
