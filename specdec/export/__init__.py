"""Exporting specdec drafters to the checkpoint layouts serving engines load (`specdec export`); it
may import `specdec.checkpoints`, `specdec.staging` and `specdec.drafters` (their loaders).

    export("medusa", "heads/", "vllm", "out/")                  # -> Path("out")
    export("mtp", "target-with-mtp/", "sglang", "out/")        # a copy of the target, mtp.* inside
    export("dflash", "dflash/", "vllm", "out/")                 # the z-lab layout both engines load

`EXPORTERS` maps each drafter kind to the module that exports it: its `write(src, engine, staging,
target)` puts one export's files into an empty directory, its `read(exported, engine, scratch)`
gives a directory specdec's own loader reads (the round-trip check), its `SOURCE_FILES` the files
a hub id given as SRC must provide (`specdec.checkpoints.resolve_checkpoint`). What each engine loads is
written down in `specdec.export.layouts`; a kind joins by one module, one `EXPORTERS` entry and its
layouts there.
An export is written beside `out` and renamed onto it at the end (`specdec.staging`).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Protocol, cast

from specdec.export.layouts import ENGINES, LAYOUTS, UNSUPPORTED, Layout, layout_for, mismatches
from specdec.staging import check_out, staged

__all__ = ["ENGINES", "EXPORTERS", "LAYOUTS", "UNSUPPORTED", "Exporter", "Layout", "export", "layout_for",
           "mismatches", "read_back"]


class Exporter(Protocol):
    """What a kind's module provides (imported only when that kind is exported)."""

    SOURCE_FILES: tuple[str, ...]  # the files SRC's hub repository must give (`resolve_checkpoint`'s files)

    def write(self, src: Path, engine: str, staging: Path, target: Path | None) -> None:
        """Write the drafter at `src` in `engine`'s layout into the empty directory `staging`."""

    def read(self, exported: Path, engine: str, scratch: Path) -> Path:
        """A directory specdec's loader reads holding the export (the export itself, or a conversion in `scratch`)."""


EXPORTERS: dict[str, str] = {  # drafter kind -> the module exporting it
    "medusa": "specdec.export.medusa",
    "eagle": "specdec.export.eagle",
    "eagle3": "specdec.export.eagle3",
    "mtp": "specdec.export.mtp",
    "dflash": "specdec.export.dflash",
}


def _exporter(kind: str) -> Exporter:
    if kind not in EXPORTERS:
        raise ValueError(f"export: unknown drafter kind {kind!r}; exportable kinds are {sorted(EXPORTERS)}")
    return cast(Exporter, importlib.import_module(EXPORTERS[kind]))


def export(kind: str, src: str | Path, to: str, out: str | Path, target: str | Path | None = None) -> Path:
    """Write the `kind` drafter specdec loads from `src` into the new directory `out`, in the layout
    engine `to` loads; `target` is the target checkpoint (MTP: the copy's source, default `src`;
    others: checked for fit when given). Returns `out`. Nothing is left at `out` on failure."""
    exporter = _exporter(kind)
    layout_for(kind, to)  # refuses what the engine cannot load, before anything is read
    from specdec.checkpoints import resolve_checkpoint

    src, out = resolve_checkpoint(src, f"export: SRC ({kind} checkpoint)", exporter.SOURCE_FILES), Path(out)
    if target is not None:
        target = resolve_checkpoint(target, "export: --target")
    check_out(out)
    with staged(out) as staging:
        exporter.write(src, to, staging, None if target is None else Path(target))
    return out


def read_back(kind: str, exported: str | Path, to: str, scratch: str | Path) -> Path:
    """A directory specdec's `kind` drafter loads (`path=`) holding the `to` export at `exported`: the
    export itself where specdec reads that layout, else a conversion written to `scratch`."""
    layout_for(kind, to)
    return _exporter(kind).read(Path(exported), to, Path(scratch))
