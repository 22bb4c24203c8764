"""Building a retrieval datastore (`specdec.data.datastore` gives its format): tokenise the
corpus, sort every suffix of the concatenated documents (a suffix array by prefix doubling), and
write the three files all or nothing."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specdec.data.datastore import (FORMAT, INDEX_DTYPES, MANIFEST, SUFFIXES, TOKEN_DTYPES, TOKENS, VERSION,
                                    DatastoreError, Log, tokenizer_identity)
from specdec.staging import check_out, staged, write_json

__all__ = ["build_datastore", "build_datastore_from_ids", "suffix_array"]

PACKED_KEY_LIMIT = int(np.iinfo(np.int64).max)  # sort keys packed into one int64 below this


def suffix_array(keys: np.ndarray, log: Log | None = None) -> np.ndarray:
    """int64 [n]: the starts of the suffixes of `keys` (ints [n]) in lexicographic order, a suffix
    before the longer ones it begins.

    Prefix doubling (Manber and Myers 1993) in numpy: round r sorts by the first 2**r keys; a
    suffix's rank is the sorted index where its group starts, and only groups still tied are
    re-sorted (Larsson and Sadakane 2007), so a round costs O(u log u) for u tied suffixes.
    """
    n = keys.shape[0]
    order = np.argsort(keys).astype(np.int64)  # (n,); ties are settled by the rounds
    rank = np.empty(n, dtype=np.int64)
    first = keys[order]
    boundary = np.ones(n, dtype=bool)
    boundary[1:] = first[1:] != first[:-1]
    rank[order] = np.maximum.accumulate(np.where(boundary, np.arange(n), 0))
    active = np.flatnonzero(_tied(boundary))  # sorted indices of suffixes in groups of two or more
    packed = (n + 1) * (n + 1) < PACKED_KEY_LIMIT
    width, rounds = 1, 0
    while active.size:
        rounds += 1
        if log is not None:
            log(f"sorting suffixes: round {rounds}, {active.size:,} of {n:,} still tied")
        positions = order[active]
        shifted = positions + width
        second = np.where(shifted < n, rank[np.minimum(shifted, n - 1)], -1)  # past the end sorts first
        first_rank = rank[positions]  # sort by (group start, rank `width` later)
        if packed:  # one int64 key, < n**2 + 2n: a single argsort
            perm = np.argsort(first_rank * (n + 1) + (second + 1))
        else:  # past about 3e9 suffixes the packed key would overflow int64
            perm = np.lexsort((second, first_rank))
        positions, first_rank, second = positions[perm], first_rank[perm], second[perm]
        order[active] = positions  # groups keep their places: the key sorts by group start first
        boundary = np.ones(active.size, dtype=bool)
        boundary[1:] = (first_rank[1:] != first_rank[:-1]) | (second[1:] != second[:-1])
        rank[positions] = active[np.maximum.accumulate(np.where(boundary, np.arange(active.size), 0))]
        active = active[_tied(boundary)]
        width *= 2
    return order


def _tied(boundary: np.ndarray) -> np.ndarray:
    """Bool [m]: whether each element of sorted runs (boundary marks run starts) shares its run."""
    run = np.cumsum(boundary) - 1
    return np.bincount(run)[run] > 1


def build_datastore(files_or_texts: Iterable[Path | str], tokenizer: Any, out: str | Path,
                    log: Log | None = None) -> Path:
    """Tokenise documents and write their datastore to the new directory `out`; return it.

    A `Path` is a UTF-8 file, one document; a `str` is a document's text. Ids come from
    `tokenizer(texts, add_special_tokens=False)` (a transformers tokenizer), whose identity
    (`tokenizer_identity`) the manifest records.
    """
    from specdec.checkpoints import quiet_transformers

    out = Path(out)
    _check_out(out)
    say = log or (lambda line: None)
    items = list(files_or_texts)
    if not items:
        raise DatastoreError("datastore: no documents given (an empty corpus); pass files or texts")
    documents: list[np.ndarray] = []
    sources: list[str] = []
    batch: list[str] = []  # texts tokenised together, about a million characters
    batch_chars = 0
    for number, item in enumerate(items, 1):
        if isinstance(item, Path):
            batch.append(_read(item))
            sources.append(str(item))
        elif isinstance(item, str):
            batch.append(item)
        else:
            raise TypeError(f"datastore: documents are Paths (files) or strs (texts), got {type(item).__name__}")
        batch_chars += len(batch[-1])
        if batch_chars >= 1 << 20 or number == len(items):
            with quiet_transformers():  # no "longer than the model's maximum length" warnings
                encoded = tokenizer(batch, add_special_tokens=False, return_attention_mask=False)["input_ids"]
            documents.extend(np.asarray(ids, dtype=np.int64) for ids in encoded)
            batch, batch_chars = [], 0
            say(f"tokenised {number} of {len(items)} documents")
    return _write(documents, out, tokenizer_identity(tokenizer), sources, say, what=_describe(items))


def build_datastore_from_ids(documents: Iterable[Sequence[int] | np.ndarray], out: str | Path, *,
                             vocab_size: int | None = None, tokenizer: Any = None, sources: Sequence[str] = (),
                             log: Log | None = None) -> Path:
    """Write the datastore of already tokenised documents (lists or arrays of ids) to `out`.

    Give the tokenizer (its identity is recorded) or at least `vocab_size` (ids lie below it;
    the manifest then holds no fingerprint); `sources` names the inputs in the manifest.
    """
    out = Path(out)
    _check_out(out)
    if tokenizer is not None:
        identity = tokenizer_identity(tokenizer)
        if vocab_size is not None and vocab_size != identity["vocab_size"]:
            raise ValueError(f"datastore: vocab_size {vocab_size!r} differs from the tokenizer's "
                             f"{identity['vocab_size']} ids; give one of them")
    elif vocab_size is not None:
        identity = {"vocab_size": vocab_size, "fingerprint": None, "name": ""}
    else:
        raise ValueError("datastore: give the tokenizer or vocab_size of the ids")
    if isinstance(identity["vocab_size"], bool) or not isinstance(identity["vocab_size"], int) \
            or not 0 < identity["vocab_size"] < 2**32 - 1:
        raise ValueError(f"datastore: vocab_size must be an int in [1, 2**32 - 2], got {identity['vocab_size']!r}")
    arrays = [np.asarray(ids, dtype=np.int64) for ids in documents]
    flat = next((i for i, ids in enumerate(arrays) if ids.ndim != 1), None)
    if flat is not None:
        raise ValueError(f"datastore: document {flat} has shape {arrays[flat].shape}; each document is one list of ids")
    return _write(arrays, out, identity, list(sources), log or (lambda line: None), what="the documents given")


def _write(documents: list[np.ndarray], out: Path, identity: dict[str, Any], sources: list[str], say: Log,
           what: str) -> Path:
    """Concatenate, sort the suffixes and write all three files atomically."""
    vocab = identity["vocab_size"]
    for number, ids in enumerate(documents):
        outside = ids[(ids < 0) | (ids >= vocab)]
        if outside.size:
            raise DatastoreError(f"datastore: document {number} of {what} holds id {int(outside[0])}, outside the "
                                 f"tokenizer's vocabulary [0, {vocab})")
    documents = [ids for ids in documents if ids.size]
    if not documents:
        raise DatastoreError(f"datastore: {what} hold no tokens (an empty corpus); give documents with text")
    start = time.perf_counter()
    ends = np.cumsum([ids.size + 1 for ids in documents]) - 1  # (D,) each document's separator
    token_dtype = "uint16" if vocab < np.iinfo(np.uint16).max else "uint32"
    separator = int(np.iinfo(np.dtype(TOKEN_DTYPES[token_dtype])).max)
    keys = np.concatenate([np.append(ids, -1) for ids in documents])  # (n,)
    keys[ends] = vocab + np.arange(len(documents))  # separators: above every id, each its own
    order = suffix_array(keys, say)[: keys.size - len(documents)]  # the separators sort last: dropped
    index_dtype = "int32" if keys.size < 2**31 else "int64"
    tokens = np.where(keys < vocab, keys, separator).astype(TOKEN_DTYPES[token_dtype])
    suffixes = order.astype(INDEX_DTYPES[index_dtype])
    seconds = time.perf_counter() - start
    say(f"sorted {suffixes.size:,} suffixes in {seconds:.2f} s")
    with staged(out) as staging:
        files = {}
        for name, array in ((TOKENS, tokens), (SUFFIXES, suffixes)):
            array.tofile(staging / name)
            files[name] = {"bytes": array.nbytes, "sha256": hashlib.sha256(array.data).hexdigest()}
        write_json(staging / MANIFEST, {
            "format": FORMAT, "version": VERSION, "token_dtype": token_dtype, "index_dtype": index_dtype,
            "separator": separator, "num_tokens": int(keys.size), "num_documents": len(documents),
            "num_suffixes": int(suffixes.size), "tokenizer": identity, "sources": sources,
            "files": files})  # no timings: the same corpus gives the same bytes
    return out


def _check_out(out: Path) -> None:
    check_out(out, "datastore")


def _read(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"datastore: input file {str(path)!r} does not exist" +
                                (" (it is a directory; pass its files)" if path.is_dir() else ""))
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise DatastoreError(f"datastore: input file {str(path)!r} is not UTF-8 text ({error})") from None


def _describe(items: list[Path | str]) -> str:
    files = [str(item) for item in items if isinstance(item, Path)]
    texts = len(items) - len(files)
    named = ", ".join(repr(name) for name in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    parts = ([f"the files {named}"] if files else []) + ([f"{texts} texts"] if texts else [])
    return " and ".join(parts)
