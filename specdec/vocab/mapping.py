"""The token intersection of two vocabularies, for token-level intersection (TLI) drafting (Timor et
al., ICML 2025, "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies"): the drafter's distribution restricted to the shared tokens,
renormalised and written into the target's vocabulary.

Rules:
- Two ids correspond when their token bytes (`specdec.vocab.token_bytes`) are equal.
- Within one vocabulary several ids can carry the same bytes (a byte-fallback `<0x41>` beside `A`,
  duplicated added tokens): the canonical one, the id that the tokenizer's own encoding of those
  bytes yields as a single token (encoded as plain text continuing a text, so without a dummy
  prefix), is kept and the others stay unshared; when none is canonical (or the bytes are not valid
  UTF-8) the bytes stay unshared. Ids whose bytes are empty stay unshared.
- Special tokens are unshared, except end-of-sequence, which maps to end-of-sequence (both
  tokenizers must have one).
- Ids at or past len(tokenizer) (the padding rows of a model's vocabulary) are unshared.
- The map is checked one-to-one after it is built (and after it is read from the cache).
- No shared text token at all, or a model vocabulary smaller than its tokenizer, is refused.

Maps are cached in memory, keyed by a fingerprint (SHA-256 over both tokenizers' token bytes,
special ids, kept duplicates and the two model vocabulary sizes), and on disk as one safetensors
file per pair under `$XDG_CACHE_HOME/specdec/vocab-maps` (else `~/.cache/specdec/vocab-maps`),
written atomically; a cache file that does not load or does not pass the checks is rebuilt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdec.vocab.token_bytes import ByteVocab, byte_vocab

__all__ = ["NoSharedTokens", "VocabMap", "build_map", "clear_memory_cache", "default_cache_dir", "shareable_bytes",
           "vocab_map"]

FORMAT = "specdec-vocab-map/1"


class NoSharedTokens(ValueError):
    """Two vocabularies without one shared text token: TLI cannot bridge them (SLEM can)."""


@dataclass(frozen=True)
class VocabMap:
    """A one-to-one map between the shared ids of a draft and a target vocabulary (-1: unshared)."""

    draft_to_target: torch.Tensor  # (Vd,) int64, Vd = the draft model's output rows
    target_to_draft: torch.Tensor  # (Vt,) int64, Vt = the target model's output rows
    draft_ids: torch.Tensor        # (S,) int64, the shared ids in the draft vocabulary, increasing
    target_ids: torch.Tensor       # (S,) int64, their ids in the target vocabulary (same order)

    def __post_init__(self) -> None:
        for name in ("draft_to_target", "target_to_draft", "draft_ids", "target_ids"):
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor) or value.dtype != torch.long or value.dim() != 1:
                raise ValueError(f"VocabMap.{name} must be a 1-D int64 tensor, got {value!r:.80}")
        if self.draft_ids.shape != self.target_ids.shape:
            raise ValueError(f"VocabMap: {self.draft_ids.numel()} draft ids beside "
                             f"{self.target_ids.numel()} target ids")

    @property
    def shared(self) -> int:
        """How many ids the two vocabularies share (end-of-sequence included)."""
        return self.draft_ids.numel()

    @property
    def draft_vocab(self) -> int:
        return self.draft_to_target.numel()

    @property
    def target_vocab(self) -> int:
        return self.target_to_draft.numel()

    def to(self, device: torch.device | str) -> VocabMap:
        """The same map with its tensors on `device`."""
        return VocabMap(*(getattr(self, f.name).to(device) for f in dataclasses.fields(self)))

    def logits_to_target(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., Vd) draft logits -> (..., Vt): the draft logit at each shared target id, -inf elsewhere,
        so that a softmax restricts to the shared tokens and renormalises (TLI). Index ops only, fixed
        shapes: traceable by torch.compile."""
        if logits.shape[-1] != self.draft_vocab:
            raise ValueError(f"logits have {logits.shape[-1]} columns, the draft vocabulary {self.draft_vocab}")
        out = logits.new_full((*logits.shape[:-1], self.target_vocab), float("-inf"))  # (..., Vt)
        return out.index_copy(-1, self.target_ids, logits.index_select(-1, self.draft_ids))

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids (any shape, all shared: the caller guarantees it) -> the draft's ids."""
        return self.target_to_draft[target_ids]

    def check(self) -> VocabMap:
        """Raise ValueError unless the map is one-to-one and its four tensors agree; return self."""
        d2t, t2d, draft_ids, target_ids = (t.cpu() for t in (self.draft_to_target, self.target_to_draft,
                                                              self.draft_ids, self.target_ids))
        for name, ids, size in (("draft", draft_ids, self.draft_vocab), ("target", target_ids, self.target_vocab)):
            unique, counts = torch.unique(ids, return_counts=True)
            if bool((counts > 1).any()):
                other, other_name = (draft_ids, "draft") if name == "target" else (target_ids, "target")
                collisions = "; ".join(f"{other_name} ids {other[ids == i].tolist()} all pair with {name} id {i}"
                                       for i in unique[counts > 1][:4].tolist())
                raise ValueError(f"the vocabulary map is not one-to-one: {collisions}")
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= size):
                raise ValueError(f"the vocabulary map holds {name} ids outside [0, {size})")
        shared = torch.nonzero(d2t >= 0).flatten()
        consistent = (torch.equal(shared, draft_ids) and torch.equal(d2t[draft_ids], target_ids)
                      and int((t2d >= 0).sum()) == draft_ids.numel() and torch.equal(t2d[target_ids], draft_ids))
        if not consistent:
            raise ValueError("the vocabulary map's tensors disagree (draft_to_target, target_to_draft and the "
                             "shared ids must describe one one-to-one map)")
        return self


def from_pairs(draft_ids: list[int], target_ids: list[int], draft_vocab: int, target_vocab: int) -> VocabMap:
    """The map of the pairs (draft_ids[i], target_ids[i]), ordered by draft id (unchecked)."""
    order = sorted(range(len(draft_ids)), key=draft_ids.__getitem__)
    draft = torch.tensor([draft_ids[i] for i in order], dtype=torch.long)
    target = torch.tensor([target_ids[i] for i in order], dtype=torch.long)
    draft_to_target = torch.full((draft_vocab,), -1, dtype=torch.long)
    target_to_draft = torch.full((target_vocab,), -1, dtype=torch.long)
    draft_to_target[draft] = target
    target_to_draft[target] = draft
    return VocabMap(draft_to_target, target_to_draft, draft, target)


def shareable_bytes(vocab: ByteVocab) -> tuple[bytes | None, ...]:
    """`vocab.table` with what may be shared: empty bytes and non-canonical duplicates become None."""
    table: list[bytes | None] = [data or None for data in vocab.table]
    holders: dict[bytes, list[int]] = defaultdict(list)
    for i, data in enumerate(table):
        if data is not None:
            holders[data].append(i)
    for data, ids in holders.items():
        if len(ids) > 1:
            keep = _canonical(vocab, data, ids)
            for i in ids:
                if i != keep:
                    table[i] = None
    return tuple(table)


def _canonical(vocab: ByteVocab, data: bytes, ids: list[int]) -> int | None:
    """The id among `ids` the tokenizer's own encoding of `data` yields as one token, if any."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    encoded = vocab.encode(text, at_start=False)
    return encoded[0] if len(encoded) == 1 and encoded[0] in ids else None


def _check_sizes(draft: ByteVocab, target: ByteVocab, draft_vocab: int, target_vocab: int) -> None:
    for role, vocab, rows in (("draft", draft, draft_vocab), ("target", target, target_vocab)):
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < len(vocab.table):
            raise ValueError(f"the {role} model has {rows!r} output rows but its tokenizer {vocab.name} has "
                             f"{len(vocab.table)} ids; pass the model's vocabulary size (config.vocab_size)")
        if vocab.eos_id is None:
            raise ValueError(f"the {role} tokenizer {vocab.name} has no end-of-sequence token; the vocabulary map "
                             "maps end-of-sequence to end-of-sequence, so both tokenizers need one")


def build_map(draft_tokenizer: Any, target_tokenizer: Any, draft_vocab: int, target_vocab: int) -> VocabMap:
    """The checked one-to-one map between the draft's `draft_vocab` and the target's `target_vocab` rows."""
    draft, target = byte_vocab(draft_tokenizer), byte_vocab(target_tokenizer)
    _check_sizes(draft, target, draft_vocab, target_vocab)
    return _build(draft, target, draft_vocab, target_vocab)


def _build(draft: ByteVocab, target: ByteVocab, draft_vocab: int, target_vocab: int) -> VocabMap:
    where = {data: i for i, data in enumerate(shareable_bytes(target)) if data is not None}
    pairs = [(i, where[data]) for i, data in enumerate(shareable_bytes(draft)) if data is not None and data in where]
    if not pairs:
        raise NoSharedTokens(f"the draft tokenizer {draft.name} and the target tokenizer {target.name} share no "
                             "token; token-level intersection (TLI) needs shared tokens, while translate='slem' (the "
                             "draft's text re-tokenised by the target) works for any pair")
    pairs.append((draft.eos_id, target.eos_id))
    return from_pairs([d for d, _ in pairs], [t for _, t in pairs], draft_vocab, target_vocab).check()


def fingerprint(draft: ByteVocab, target: ByteVocab, draft_vocab: int, target_vocab: int) -> str:
    """SHA-256 over what decides the map: token bytes, special ids, kept duplicates, vocabulary sizes."""
    digest = hashlib.sha256(FORMAT.encode())
    for vocab, rows in ((draft, draft_vocab), (target, target_vocab)):
        digest.update(f"|rows={rows}|ids={len(vocab.table)}|eos={vocab.eos_id}|".encode())
        digest.update(",".join(map(str, sorted(vocab.special_ids))).encode())
        for data, kept in zip(vocab.table, shareable_bytes(vocab)):
            marker = b"-" if data is None else (b"+" if kept is not None else b"~")
            digest.update(marker + len(data or b"").to_bytes(4, "little") + (data or b""))
    return digest.hexdigest()


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/specdec/vocab-maps`, else `~/.cache/specdec/vocab-maps`."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "specdec" / "vocab-maps"


_MEMORY: dict[str, VocabMap] = {}


def clear_memory_cache() -> None:
    """Forget the maps held in memory (the disk cache stays)."""
    _MEMORY.clear()


def vocab_map(draft_tokenizer: Any, target_tokenizer: Any, draft_vocab: int, target_vocab: int,
              cache_dir: Path | None = None) -> VocabMap:
    """`build_map`, cached in memory and in `cache_dir` (default: `default_cache_dir()`), on the CPU."""
    draft, target = byte_vocab(draft_tokenizer), byte_vocab(target_tokenizer)
    _check_sizes(draft, target, draft_vocab, target_vocab)
    key = fingerprint(draft, target, draft_vocab, target_vocab)
    if key in _MEMORY:
        return _MEMORY[key]
    path = Path(cache_dir if cache_dir is not None else default_cache_dir()) / f"{key}.safetensors"
    found = _read(path, key, draft_vocab, target_vocab)
    if found is None:
        found = _build(draft, target, draft_vocab, target_vocab)
        _write(path, found, key, f"{draft.name} -> {target.name}")
    _MEMORY[key] = found
    return found


def _read(path: Path, key: str, draft_vocab: int, target_vocab: int) -> VocabMap | None:
    """The map stored at `path`, or None when it is missing or does not pass every check."""
    from safetensors import safe_open

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as stored:
            if (stored.metadata() or {}).get("fingerprint") != key:
                return None
            draft_to_target = stored.get_tensor("draft_to_target")  # (Vd,)
            target_to_draft = stored.get_tensor("target_to_draft")  # (Vt,)
        if draft_to_target.shape != (draft_vocab,) or target_to_draft.shape != (target_vocab,):
            return None
        draft_ids = torch.nonzero(draft_to_target >= 0).flatten()
        return VocabMap(draft_to_target, target_to_draft, draft_ids, draft_to_target[draft_ids]).check()
    except Exception:  # a truncated, corrupt or foreign file: rebuilt, never trusted
        return None


def _write(path: Path, found: VocabMap, key: str, pair: str) -> None:
    """Store `found` at `path` atomically (a temporary file renamed over it); warn when that fails."""
    from safetensors.torch import save_file

    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        os.close(handle)
        save_file({"draft_to_target": found.draft_to_target.contiguous(),
                   "target_to_draft": found.target_to_draft.contiguous()}, temporary,
                  metadata={"format": FORMAT, "fingerprint": key, "pair": pair})
        os.replace(temporary, path)
        temporary = None
    except OSError as error:
        warnings.warn(f"could not write the vocabulary map cache {path}: {error}", stacklevel=3)
    finally:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
