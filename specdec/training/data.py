"""Token streams and training windows: a corpus encoded once, random windows for training
steps, evenly spaced windows for held-out evaluation.

Documents are joined with the end-of-text id between them, so windows may cross a document
boundary as in standard language-model training.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specdec.data.corpus import Corpus, read_text

__all__ = ["TokenData", "WindowSampler", "budgeted_texts", "encode_corpus", "encode_texts", "evaluation_windows",
           "training_texts"]

SINGLE_FILE_HELDOUT = 0.05  # a one-file corpus holds out its last 5% of tokens


@dataclass(frozen=True)
class TokenData:
    """The training and held-out token streams, LongTensor [N] and [M]."""

    train: torch.Tensor
    heldout: torch.Tensor
    train_files: int
    heldout_files: int


def encode_texts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens; batched in the Rust tokenizer when there is one."""
    backend = getattr(tokenizer, "_tokenizer", None) or getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "encode_batch"):
        backend = tokenizer  # a bare tokenizers.Tokenizer
    if backend is not None:
        return [encoding.ids for encoding in backend.encode_batch(list(texts), add_special_tokens=False)]
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def _stream(tokenizer: Any, texts: Sequence[str], separator: int | None) -> torch.Tensor:
    ids: list[int] = []
    for encoded in encode_texts(tokenizer, texts):
        ids.extend(encoded)
        if separator is not None:
            ids.append(separator)
    return torch.tensor(ids, dtype=torch.long)


def budgeted_texts(texts: list[tuple[str, str]], max_chars: int | None) -> list[str]:
    """Texts in a fixed pseudo-random order (SHA-256 of the name) until `max_chars` are taken."""
    ordered = sorted(texts, key=lambda item: hashlib.sha256(item[0].encode()).hexdigest())
    if max_chars is None:
        return [text for _, text in ordered]
    taken, total = [], 0
    for _, text in ordered:
        if total >= max_chars:
            break
        taken.append(text[: max_chars - total])
        total += len(taken[-1])
    return taken


def _named_texts(corpus: Corpus, paths: Sequence[Any]) -> list[tuple[str, str]]:
    """(name, text) of each UTF-8 file of `paths` (the others skipped)."""
    return [(corpus.relative(p), t) for p in paths if (t := read_text(p)) is not None]


def training_texts(corpus: Corpus, max_chars: int | None) -> list[str]:
    """The corpus's UTF-8 training files in `budgeted_texts`' order, up to `max_chars` characters
    (a tokenizer's training text)."""
    return budgeted_texts(_named_texts(corpus, corpus.train), max_chars)


def encode_corpus(tokenizer: Any, corpus: Corpus, separator: int | None, max_train_chars: int | None = None,
                  max_heldout_chars: int | None = None) -> TokenData:
    """Encode the corpus's files (skipping non-UTF-8 ones), each side capped at a character budget,
    with `separator` (the end-of-text id; None: nothing) after each file.

    A corpus with no held-out file (a single data file) holds out the last 5% of its tokens.
    """
    train, heldout = _named_texts(corpus, corpus.train), _named_texts(corpus, corpus.heldout)
    if not train:
        raise ValueError(f"no UTF-8 training text among the {len(corpus.train)} training files under {corpus.root}")
    train_ids = _stream(tokenizer, budgeted_texts(train, max_train_chars), separator)
    if heldout:
        heldout_ids = _stream(tokenizer, budgeted_texts(heldout, max_heldout_chars), separator)
    else:
        cut = int(train_ids.shape[0] * (1 - SINGLE_FILE_HELDOUT))
        train_ids, heldout_ids = train_ids[:cut], train_ids[cut:]
    return TokenData(train_ids, heldout_ids, len(train), len(heldout))


class WindowSampler:
    """Random windows of `length` tokens from a stream, reproducible from `seed`."""

    def __init__(self, ids: torch.Tensor, length: int, seed: int) -> None:
        if ids.shape[0] <= length:
            raise ValueError(f"the training text has {ids.shape[0]} tokens, fewer than one window of {length}; "
                             "pass more data or a shorter --seq-len")
        self.ids, self.length = ids, length
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, batch: int) -> torch.Tensor:
        """LongTensor [batch, length]."""
        starts = torch.randint(0, self.ids.shape[0] - self.length + 1, (batch,), generator=self.generator)
        return torch.stack([self.ids[s : s + self.length] for s in starts.tolist()])


def evaluation_windows(ids: torch.Tensor, length: int, count: int) -> torch.Tensor:
    """Up to `count` evenly spaced, non-overlapping windows of `length` tokens: LongTensor [n, length]."""
    available = ids.shape[0] // length
    if available == 0:
        raise ValueError(f"the held-out text has {ids.shape[0]} tokens, fewer than one window of {length}")
    n = min(count, available)
    stride = available // n
    return torch.stack([ids[i * stride * length : i * stride * length + length] for i in range(n)])
