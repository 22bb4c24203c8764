"""Writing an export all or nothing: into a hidden temporary directory beside `--out`, renamed onto
it at the end, removed on any failure. A non-empty `--out` is never touched."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["check_out", "staged", "write_json"]


def check_out(out: Path, what: str = "export") -> None:
    """Raise unless `out` is absent or an empty directory; messages start with `what`."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{what}: --out {str(out)!r} is a file; give a new directory")
    if out.is_dir() and any(out.iterdir()):
        raise FileExistsError(f"{what}: --out {str(out)!r} is not empty; refusing to overwrite it, "
                              "give a new or empty directory")


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A fresh directory to write the export into; on a clean exit it becomes `out`."""
    check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.{secrets.token_hex(4)}.partial"
    staging.mkdir()  # like any new directory (the umask's mode), unlike mkdtemp's 0700
    try:
        yield staging
        check_out(out)  # something may have written there meanwhile
        os.replace(staging, out)  # atomic; an empty `out` directory is replaced
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_json(path: Path, data: dict[str, Any]) -> None:
    """config.json style: indented, sorted keys, a final newline."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
