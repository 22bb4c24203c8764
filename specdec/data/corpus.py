"""Text corpora for training and held-out evaluation: the running interpreter's standard-library
source, and any text files a user names, each split deterministically BY FILE.

A file's side of the split depends only on its path relative to the corpus root: files are
ranked by the SHA-256 of that path and the first `ceil(n * heldout_fraction)` ranks are held
out. The split is the same on every machine with the same file list, adding a file moves no
other file across it, and held-out files are never trained on.
"""

from __future__ import annotations

import hashlib
import math
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Corpus", "HELDOUT_FRACTION", "files_corpus", "read_text", "split_by_file", "stdlib_corpus"]

HELDOUT_FRACTION = 1 / 16  # 6.25% of files
# Test suites, installed packages, and generated data rather than code (codec tables, pydoc's topic dump).
SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "encodings",
                          "pydoc_data"})


@dataclass(frozen=True)
class Corpus:
    """Files under `root`, split into `train` and `heldout` (sorted paths, disjoint)."""

    root: Path
    train: tuple[Path, ...]
    heldout: tuple[Path, ...]

    def relative(self, path: Path) -> str:
        """`path` relative to the root, with forward slashes (what the split hashes)."""
        return path.relative_to(self.root).as_posix() if path.is_relative_to(self.root) else path.as_posix()


def _rank_key(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def split_by_file(names: Sequence[str], heldout_fraction: float = HELDOUT_FRACTION) -> tuple[set[str], set[str]]:
    """(train, heldout) name sets: the ceil(n * fraction) names of lowest SHA-256 are held out.

    With one name nothing can be held out by file; the caller splits that file's tokens instead.
    """
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction!r}")
    unique = sorted(set(names))
    if len(unique) < 2:
        return set(unique), set()
    count = min(len(unique) - 1, math.ceil(len(unique) * heldout_fraction))
    ranked = sorted(unique, key=_rank_key)
    return set(ranked[count:]), set(ranked[:count])


def stdlib_root() -> Path:
    """The directory of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_corpus(root: Path | None = None, heldout_fraction: float = HELDOUT_FRACTION) -> Corpus:
    """The standard library's `.py` files (not its test suites, installed packages or generated data
    modules; see SKIPPED_DIRS), split by file.

    Raises FileNotFoundError when the installation ships no `.py` sources.
    """
    root = Path(root) if root is not None else stdlib_root()
    files = sorted(path for path in root.rglob("*.py")
                   if path.is_file() and not SKIPPED_DIRS.intersection(path.relative_to(root).parts[:-1]))
    if len(files) < 2:
        raise FileNotFoundError(f"found {len(files)} .py files under {root}; specdec's corpus is the standard "
                                "library's source, so use a Python installation that ships its .py files")
    return _split(root, files, heldout_fraction)


def files_corpus(paths: Iterable[str | Path], suffixes: tuple[str, ...] = (".py", ".txt", ".md", ".rst", ".json"),
                 heldout_fraction: float = HELDOUT_FRACTION) -> Corpus:
    """The files named, and the files with `suffixes` under the directories named, split by file.

    Raises FileNotFoundError naming a path that does not exist or a directory without text files.
    """
    files: list[Path] = []
    for item in paths:
        path = Path(item)
        if path.is_file():
            files.append(path.resolve())
        elif path.is_dir():
            found = sorted(p.resolve() for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
            if not found:
                raise FileNotFoundError(f"{str(path)!r} holds no files ending in {', '.join(suffixes)}")
            files.extend(found)
        else:
            raise FileNotFoundError(f"data path {str(path)!r} does not exist; pass text files or directories")
    if not files:
        raise FileNotFoundError("no data files given; pass text files or directories")
    files = sorted(set(files))
    root = Path(*_common_parts(files)) if len(files) > 1 else files[0].parent
    return _split(root, files, heldout_fraction)


def _common_parts(files: Sequence[Path]) -> tuple[str, ...]:
    parts = files[0].parent.parts
    for file in files[1:]:
        other = file.parent.parts
        n = 0
        while n < min(len(parts), len(other)) and parts[n] == other[n]:
            n += 1
        parts = parts[:n]
    return parts or (files[0].anchor,)


def _split(root: Path, files: Sequence[Path], heldout_fraction: float) -> Corpus:
    names = {path.relative_to(root).as_posix(): path for path in files}
    train, heldout = split_by_file(list(names), heldout_fraction)
    return Corpus(root, tuple(names[n] for n in sorted(train)), tuple(names[n] for n in sorted(heldout)))


def read_text(path: Path) -> str | None:
    """The file decoded as UTF-8, or None when it is not valid UTF-8 (such files are skipped)."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
