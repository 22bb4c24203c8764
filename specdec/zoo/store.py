"""Where zoo families live: `$XDG_CACHE_HOME/specdec/zoo` (else `~/.cache/specdec/zoo`), one
directory per family named `{name}-{settings key}`.

A build writes into a hidden staging directory and renames it into place only after the last
file and the manifest are written, under a lock, so a family directory that exists is complete:
an interrupted build leaves only a staging directory, removed by the next build.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specdec.zoo.settings import ZooSettings

__all__ = ["CALIBRATION", "MANIFEST", "PIECES", "SHIPPED", "SHIPPED_RECORD", "cache_root", "family_dir", "finished",
           "manifest", "shipped_names", "ships", "staging", "staging_into"]

MANIFEST = "manifest.json"
# the shipped families, one folder each; a folder name no import can reach, so packaging takes it as data
SHIPPED = Path(__file__).resolve().with_name("shipped-families")
SHIPPED_RECORD = "shipped.json"
CALIBRATION = "value_temperatures.json"  # the dynamic-tree value temperature of each learned drafter
PIECES = {"tokenizer": "tokenizer", "target": "target", "draft-model": "draft-model",
          "draft-model-xtok": "draft-model-xtok", "medusa": "medusa", "eagle": "eagle", "eagle3": "eagle3",
          "mtp": "target", "dflash": "dflash", "pard": "pard", "datastore": "datastore"}  # piece -> directory (the MTP module lives in the target's files)


def cache_root(override: str | Path | None = None) -> Path:
    """The zoo cache directory: `override`, else $XDG_CACHE_HOME/specdec/zoo, else ~/.cache/specdec/zoo."""
    if override is not None:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "specdec" / "zoo"


def shipped_names(source: Path = SHIPPED) -> tuple[str, ...]:
    """The families that ship with the code (folders of `source` holding a shipped.json)."""
    return tuple(sorted(p.parent.name for p in source.glob(f"*/{SHIPPED_RECORD}"))) if source.is_dir() else ()


def ships(name: str) -> bool:
    """Whether the family `name` ships with the code (`specdec.zoo.shipped`)."""
    return name in shipped_names()


def family_dir(settings: ZooSettings, root: str | Path | None = None) -> Path:
    return cache_root(root) / settings.directory_name


def finished(settings: ZooSettings, root: str | Path | None = None) -> bool:
    """Whether a complete build of `settings` is in the cache."""
    return (family_dir(settings, root) / MANIFEST).is_file()


def manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a built family directory."""
    file = directory / MANIFEST
    if not file.is_file():
        raise FileNotFoundError(f"{directory} is not a finished zoo build (no {MANIFEST}); run `specdec zoo build`")
    return json.loads(file.read_text())


@contextlib.contextmanager
def staging(settings: ZooSettings, root: str | Path | None = None) -> Iterator[Path | None]:
    """Hold the family's lock and yield an empty staging directory, or None if the family is built
    (`staging_into` its directory)."""
    with staging_into(family_dir(settings, root)) as work:
        yield work


@contextlib.contextmanager
def staging_into(final: Path) -> Iterator[Path | None]:
    """Hold `final`'s lock and yield an empty staging directory, or None if `final` is complete
    (holds its manifest).

    Leaving the block normally renames the staging directory into place (it must hold the
    manifest by then); an exception removes it.
    """
    if (final / MANIFEST).is_file():  # finished: no lock needed, so a read-only cache serves too
        yield None
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent build of the same family waits here
        if (final / MANIFEST).is_file():
            yield None
            return
        work = final.parent / f".{final.name}.partial"
        shutil.rmtree(work, ignore_errors=True)  # an interrupted build's leftovers
        if final.exists():  # a directory without a manifest is not a build
            shutil.rmtree(final)
        work.mkdir()
        try:
            yield work
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        if not (work / MANIFEST).is_file():
            shutil.rmtree(work, ignore_errors=True)
            raise RuntimeError(f"zoo build of {final.name} finished without writing {MANIFEST}")
        work.rename(final)
