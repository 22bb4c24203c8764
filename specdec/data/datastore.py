"""The retrieval datastore of REST (He et al. 2023, "REST: Retrieval-Based Speculative Decoding",
arXiv 2311.08252): a corpus's token ids and their suffix array, memory-mapped.

A datastore is a directory of three files:

    datastore.json  the manifest: format, version, dtypes, counts, the tokenizer's identity
                    (vocab size, SHA-256 fingerprint of its vocabulary, name), the source files,
                    and each binary file's size and SHA-256
    tokens.bin      every document's ids, each followed by the separator (the largest value of the
                    token dtype, never an id): [num_tokens] little-endian uint16 (vocab < 65535),
                    else uint32
    suffixes.bin    the suffix array: the start of every suffix that does not begin with a
                    separator, in lexicographic order: [num_suffixes] little-endian int32 (int64
                    from 2**31 tokens on)

In that order a separator compares greater than every id (two of them by document index), and a
query never holds one, so no match crosses a document boundary.

`specdec.data.datastore_build` writes one; this module opens, checks and reads it.

Lookup (`Datastore.continuations`): the longest suffix of the context, `max_length` tokens down
to `min_length`, that occurs (a binary search over the length, occurrence being monotone in it,
each test a binary search over the suffix array); then the continuations, up to `max_tokens`
ids, after up to `occurrences` of its occurrences, distinct ones with their counts, most
frequent first. The occurrences of a pattern are a range of the suffix array sorted by what
follows the pattern, so evenly spaced picks are a stratified sample: a continuation filling a
fraction f of the range is counted f * occurrences times, give or take one, and exactly when the
range holds at most `occurrences`. Should every pick end its document, shorter lengths are tried.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Datastore", "DatastoreError", "open_datastore", "tokenizer_identity"]

FORMAT, VERSION = "specdec-datastore", 1
MANIFEST, TOKENS, SUFFIXES = "datastore.json", "tokens.bin", "suffixes.bin"
TOKEN_DTYPES = {"uint16": "<u2", "uint32": "<u4"}
INDEX_DTYPES = {"int32": "<i4", "int64": "<i8"}
PADDING_SLACK = 1024  # LM heads may be padded past the tokenizer by this many ids (or 2%), never much more

Log = Callable[[str], None]


class DatastoreError(ValueError):
    """A datastore that cannot be built or used: empty, corrupt, or for another tokenizer."""


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """{vocab_size: len(tokenizer), fingerprint: SHA-256 of its sorted (token, id) pairs, name}."""
    vocab = sorted(tokenizer.get_vocab().items())
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()
    return {"vocab_size": len(tokenizer), "fingerprint": f"sha256:{digest}",
            "name": _tokenizer_name(str(getattr(tokenizer, "name_or_path", "") or ""))}


def _tokenizer_name(name_or_path: str) -> str:
    """A hub id as given; a local directory by its last component, so that where a tokenizer was
    loaded from (a staging directory, a cache) does not change the datastore's bytes."""
    path = Path(name_or_path)
    return path.name if name_or_path and path.is_dir() else name_or_path


def open_datastore(path: str | Path, verify: bool = True) -> Datastore:
    """The datastore in directory `path`, memory-mapped; `verify` also checks the SHA-256 of its
    files (a read of each; sizes are always checked). Raises DatastoreError naming a bad file."""
    directory = Path(path).expanduser()
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"datastore {str(directory)!r} has no {MANIFEST}" +
                                ("" if directory.is_dir() else " (no such directory)") +
                                "; build one with `specdec datastore build FILES... --tokenizer DIR --out DIR`")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DatastoreError(f"{str(manifest_path)!r} is not valid JSON ({error}): the datastore is corrupt; "
                             "rebuild it") from None
    _check_manifest(manifest, manifest_path)
    arrays = {}
    for name, dtype, count in ((TOKENS, TOKEN_DTYPES[manifest["token_dtype"]], manifest["num_tokens"]),
                               (SUFFIXES, INDEX_DTYPES[manifest["index_dtype"]], manifest["num_suffixes"])):
        file, expected = directory / name, manifest["files"][name]
        size = file.stat().st_size if file.is_file() else None
        if size != count * np.dtype(dtype).itemsize or size != expected["bytes"]:
            raise DatastoreError(f"{str(file)!r} holds {'no file' if size is None else f'{size} bytes'}, but "
                                 f"{MANIFEST} says {count} values of {np.dtype(dtype).name} ({expected['bytes']} "
                                 "bytes): the file is truncated or replaced; rebuild the datastore")
        if verify and _sha256(file) != expected["sha256"]:
            raise DatastoreError(f"{str(file)!r} does not match the SHA-256 in {MANIFEST}: the datastore is "
                                 "corrupt; rebuild it")
        arrays[name] = np.memmap(file, dtype=dtype, mode="r", shape=(count,)).view(np.ndarray)
    return Datastore(directory, manifest, arrays[TOKENS], arrays[SUFFIXES])


def _check_manifest(manifest: Any, path: Path) -> None:
    def bad(what: str) -> DatastoreError:
        return DatastoreError(f"{str(path)!r}: {what}; the datastore is corrupt or not one; rebuild it")

    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise bad(f"'format' is not {FORMAT!r}")
    if manifest.get("version") != VERSION:
        raise bad(f"format version {manifest.get('version')!r} is not {VERSION}, the one this specdec reads")
    if manifest.get("token_dtype") not in TOKEN_DTYPES or manifest.get("index_dtype") not in INDEX_DTYPES:
        raise bad(f"unknown dtypes {manifest.get('token_dtype')!r} / {manifest.get('index_dtype')!r}")
    separator = int(np.iinfo(np.dtype(TOKEN_DTYPES[manifest["token_dtype"]])).max)
    if manifest.get("separator") != separator:
        raise bad(f"separator {manifest.get('separator')!r} is not {separator}, the largest {manifest['token_dtype']}")
    counts: list[Any] = [manifest.get(key) for key in ("num_tokens", "num_documents", "num_suffixes")]
    if not all(isinstance(c, int) and c > 0 for c in counts) or counts[2] != counts[0] - counts[1]:
        raise bad(f"counts num_tokens, num_documents, num_suffixes = {counts} are inconsistent")
    tokenizer = manifest.get("tokenizer")
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("vocab_size"), int) \
            or not 0 < tokenizer["vocab_size"] < separator:
        raise bad(f"'tokenizer' holds no vocab_size in [1, {separator})")
    files = manifest.get("files")
    for name in (TOKENS, SUFFIXES):
        entry = files.get(name) if isinstance(files, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) \
                or not isinstance(entry.get("sha256"), str):
            raise bad(f"'files' has no size and SHA-256 of {name}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


class Datastore:
    """An opened datastore: `tokens` [num_tokens] and `suffixes` [num_suffixes], memory-mapped."""

    def __init__(self, path: Path, manifest: dict[str, Any], tokens: np.ndarray, suffixes: np.ndarray) -> None:
        self.path, self.manifest, self.tokens, self.suffixes = path, manifest, tokens, suffixes
        self.vocab_size: int = manifest["tokenizer"]["vocab_size"]
        self.fingerprint: str | None = manifest["tokenizer"].get("fingerprint")
        self.separator: int = int(np.iinfo(tokens.dtype).max)

    def __deepcopy__(self, memo: dict[int, Any]) -> Datastore:
        """Itself: a datastore is read-only and memory-mapped, so copies of a drafter share it."""
        return self

    def __repr__(self) -> str:
        return (f"Datastore({str(self.path)!r}: {self.suffixes.size:,} tokens in "
                f"{self.manifest['num_documents']:,} documents, vocab {self.vocab_size})")

    def pattern_range(self, pattern: Sequence[int]) -> tuple[int, int]:
        """[lo, hi): the suffix-array range of the suffixes that begin with `pattern`."""
        m, pattern = len(pattern), list(pattern)

        def head(j: int) -> list[int]:
            start = int(self.suffixes[j])
            return self.tokens[start : start + m].tolist()

        lo = bisect_left(range(self.suffixes.size), pattern, key=head)
        return lo, bisect_right(range(self.suffixes.size), pattern, lo=lo, key=head)

    def longest_match(self, context: Sequence[int], min_length: int, max_length: int) -> int:
        """The largest m in [min_length, max_length] whose last m ids of `context` occur, else 0."""
        low, high = min_length - 1, min(max_length, len(context))  # occurs(low) or low = min - 1
        while low < high:
            middle = (low + high + 1) // 2
            lo, hi = self.pattern_range(context[len(context) - middle :])
            low, high = (middle, high) if hi > lo else (low, middle - 1)
        return low if low >= min_length else 0

    def continuations(self, context: Sequence[int], max_tokens: int, occurrences: int, min_length: int,
                      max_length: int) -> list[tuple[tuple[int, ...], int]]:
        """(continuation, count) pairs after the longest matching suffix, most frequent first (ties:
        suffix-array order); each continuation 1..max_tokens ids within its document."""
        context = list(context)
        length = self.longest_match(context, min_length, max_length)
        while length >= max(min_length, 1):
            lo, hi = self.pattern_range(context[len(context) - length :])
            picks = np.arange(lo, hi) if hi - lo <= occurrences else \
                lo + (2 * np.arange(occurrences) + 1) * (hi - lo) // (2 * occurrences)  # evenly spaced
            starts = self.suffixes[picks].astype(np.int64) + length  # (N,)
            window = np.minimum(starts[:, None] + np.arange(max_tokens), self.tokens.size - 1)  # the end: a separator
            rows = self.tokens[window]  # (N, max_tokens)
            lengths = np.cumprod(rows != self.separator, axis=1).sum(axis=1)  # ids before the separator
            counts = Counter(tuple(row[:size].tolist()) for row, size in zip(rows, lengths) if size)
            if counts:
                return sorted(counts.items(), key=lambda item: -item[1])  # stable: ties keep array order
            length -= 1  # every pick ends its document: a shorter match may continue
        return []

    def check_vocab(self, vocab_size: int, tokenizer_checked: bool = False) -> None:
        """Raise DatastoreError unless the ids fit a target whose LM head has `vocab_size` rows:
        not fewer than the datastore's tokenizer, and unless `tokenizer_checked` (its fingerprint
        matched) at most the padding heads carry past it (PADDING_SLACK ids or 2%)."""
        ours, where = self.vocab_size, str(self.path / MANIFEST)
        if ours > vocab_size:
            raise DatastoreError(f"datastore {where!r} was built with a tokenizer of {ours} ids, but the target's LM "
                                 f"head has {vocab_size}: it is another tokenizer; build the datastore with the "
                                 "target's tokenizer")
        if not tokenizer_checked and vocab_size - ours > max(PADDING_SLACK, ours // 50):
            raise DatastoreError(f"datastore {where!r} was built with a tokenizer of {ours} ids, far fewer than the "
                                 f"target's {vocab_size}: it is likely another tokenizer; build the datastore with "
                                 "the target's tokenizer, or pass tokenizer=DIR to confirm it is the target's")
        separator = int(self.manifest["separator"])
        if vocab_size > separator:  # a generated id could equal the separator and match across documents
            raise DatastoreError(f"datastore {where!r} stores {self.manifest['token_dtype']} ids with separator "
                                 f"{separator}, but the target's LM head has {vocab_size} rows; rebuild it for "
                                 "the target (its ids need a wider type)")

    def check_tokenizer(self, tokenizer: Any) -> None:
        """Raise DatastoreError unless `tokenizer` is the one the datastore was built with."""
        theirs, where = tokenizer_identity(tokenizer), str(self.path / MANIFEST)
        ours = self.manifest["tokenizer"].get("name") or "(unnamed)"
        same_size = theirs["vocab_size"] == self.vocab_size
        if not same_size or (self.fingerprint is not None and theirs["fingerprint"] != self.fingerprint):
            raise DatastoreError(
                f"datastore {where!r} was built with tokenizer {ours!r} ({self.vocab_size} ids, fingerprint "
                f"{str(self.fingerprint)[:19]}), but the tokenizer given is {theirs['name'] or '(unnamed)'!r} "
                f"({theirs['vocab_size']} ids, fingerprint {theirs['fingerprint'][:19]}); rebuild the datastore with "
                "the target's tokenizer")
