"""The text bridge between two vocabularies: a growing text kept in a second tokenizer's ids, and a
drafted text re-tokenised by the target, as string-level exact match (SLEM) needs (Timor et al.,
ICML 2025, "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies").

Text travels as bytes (`specdec.vocab.token_bytes`). Only complete UTF-8 is encoded: an incomplete
tail waits for the bytes that finish it; invalid bytes are replaced by U+FFFD, so a stream never
stalls. Special tokens are never produced from text: "<s>" in a text is three characters.

`Retokenizer` re-encodes, after each extension, the text from a restart point at least `window`
destination ids back. A restart point is a space that follows a non-whitespace byte: no pre-token
of a byte-level (GPT-2, Llama 3, Qwen) or metaspace (sentencepiece) tokenizer spans it, so the
encoding from there equals the whole text's encoding from there, and the ids equal
`dest_tokenizer.encode(text, add_special_tokens=False)` (after the destination's BOS, when it adds
one). They may differ when no such space lies in the `lookback` ids before the window (a long run
of text without spaces, such as CJK or base64: then the restart falls inside a pre-token), after an
end-of-sequence (the text after it is encoded as a new text), and where the destination's
normaliser rewrites the text (then the ids still encode its normalised form). In every case the
ids' bytes spell the text.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

from specdec.vocab.token_bytes import ByteVocab, byte_vocab

__all__ = ["Retokenizer", "complete_text", "encode_bytes", "retokenize_draft"]

_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")


def complete_text(data: bytes) -> tuple[str, int]:
    """(text, n): the longest prefix of `data` that is complete UTF-8, decoded, and its n bytes.

    Only a valid but unfinished last character is held back; invalid bytes become U+FFFD.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=False)
    return text, len(data) - len(decoder.getstate()[0])


def encode_bytes(tokenizer: Any, data: bytes, at_start: bool = True) -> tuple[list[int], int]:
    """(ids, n): the tokenizer's ids for the longest complete-UTF-8 prefix of `data` (n bytes), never
    a special token; `at_start=False` encodes a piece continuing a text (no dummy prefix)."""
    text, consumed = complete_text(bytes(data))
    return byte_vocab(tokenizer).encode(text, at_start=at_start), consumed


def _is_restart(text: bytes | bytearray, offset: int | None) -> bool:
    """Whether a token starting at `offset` begins with a space that follows a non-whitespace byte."""
    return (offset is not None and 0 < offset < len(text) and text[offset] == 0x20
            and text[offset - 1] not in _WHITESPACE)


class Retokenizer:
    """A destination tokenizer's ids for a growing text given as source ids (module docstring)."""

    def __init__(self, source_tokenizer: Any, dest_tokenizer: Any, window: int = 8, *, lookback: int = 256) -> None:
        for name, value in (("window", window), ("lookback", lookback)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Retokenizer: {name} must be an int >= 1, got {value!r}")
        self.source: ByteVocab = byte_vocab(source_tokenizer)
        self.dest: ByteVocab = byte_vocab(dest_tokenizer)
        self.window, self.lookback = window, lookback
        self.reset([])

    @property
    def ids(self) -> list[int]:
        """The destination ids of the text so far (its complete UTF-8)."""
        return list(self._ids)

    @property
    def pending_bytes(self) -> bytes:
        """An incomplete UTF-8 tail that waits for more bytes before it is encoded."""
        return self._decoder.getstate()[0]

    def reset(self, source_ids: Sequence[int]) -> None:
        """Start over with the prompt `source_ids`. A source BOS at position 0 becomes the destination's
        BOS when the destination adds one to its encodings; other source specials are dropped, except
        end-of-sequence, which becomes the destination's."""
        self._ids: list[int] = []
        self._strip = self.source.stripped_spaces  # the source's decoding drops these leading spaces
        self._open_segment()
        ids = [int(i) for i in source_ids]
        if ids and self.source.bos_id is not None and ids[0] == self.source.bos_id:
            if self.dest.adds_bos and self.dest.bos_id is not None:
                self._ids.append(self.dest.bos_id)
                self._open_segment()
            ids = ids[1:]
        self.extend(ids)

    def extend(self, source_ids: Sequence[int]) -> int:
        """Append committed source ids; return the index of the first destination id that changed
        (the ids before it are unchanged; len(ids) before the call when none changed). End-of-sequence
        becomes the destination's; other ids without text (specials, padding rows) are dropped."""
        changed = len(self._ids)
        table, raw = self.source.table, bytearray()
        for i in map(int, source_ids):
            data = table[i] if 0 <= i < len(table) else None
            if data is not None:
                raw += data
            elif i == self.source.eos_id:
                changed = min(changed, self._append(raw, final=True))
                raw = bytearray()
                if self.dest.eos_id is not None:
                    self._ids.append(self.dest.eos_id)
                self._open_segment()
        return min(changed, self._append(raw, final=False))

    def _open_segment(self) -> None:
        self._segment = len(self._ids)          # the first destination id of the open text
        self._text = bytearray()                # its complete UTF-8, which the ids from _segment encode
        self._starts: list[int | None] = []     # where each of those ids starts in _text (None: unknown)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _append(self, raw: bytearray, final: bool) -> int:
        while self._strip and raw[:1] == b" ":
            del raw[0]
            self._strip -= 1
        if raw:
            self._strip = 0
        text = self._decoder.decode(bytes(raw), final=final)
        if not text:
            return len(self._ids)
        self._text += text.encode("utf-8")
        return self._reencode()

    def _reencode(self) -> int:
        start, new, starts = self._encode_from(self._restart())
        old = self._ids[start:]
        self._ids[start:] = new
        self._starts[start - self._segment:] = starts
        differ = (k for k, (a, b) in enumerate(zip(old, new)) if a != b)
        return start + next(differ, min(len(old), len(new)))

    def _restart(self) -> int:
        """The id to re-encode from: a restart point at least `window` ids back (module docstring)."""
        segment, last = self._segment, len(self._ids) - self.window
        if last <= segment:
            return segment
        floor = max(segment, last - self.lookback)
        for i in range(last, floor, -1):
            if _is_restart(self._text, self._starts[i - segment]):
                return i
        if floor == segment:
            return segment
        for i in range(last, segment, -1):  # no restart point: the latest id starting a character
            offset = self._starts[i - segment]
            if offset is not None and offset < len(self._text) and self._text[offset] & 0xC0 != 0x80:
                return i
        return segment

    def _encode_from(self, start: int) -> tuple[int, list[int], list[int | None]]:
        """(start, ids, starts): the ids of the open text from id `start` on (or from the open text's
        first id, when the piece from `start` does not encode as itself) and where each starts."""
        at_start = start == self._segment
        offset = 0 if at_start else self._starts[start - self._segment]
        piece = bytes(self._text[offset:])
        ids = self.dest.encode(piece.decode("utf-8"), at_start=at_start)
        pieces = [self.dest.table[i] if 0 <= i < len(self.dest.table) else None for i in ids]
        lead = 0
        if None not in pieces:
            joined = b"".join(pieces)
            lead = len(joined) - len(piece)
            if joined[max(lead, 0):] != piece or lead not in ((0, 1) if at_start else (0,)):
                if not at_start:  # the piece did not encode as itself: encode the whole open text
                    return self._encode_from(self._segment)
                return start, ids, [0] + [None] * (len(ids) - 1)  # normalised text: offsets unknown
        starts: list[int | None] = []
        position: int | None = -lead
        for data in pieces:
            starts.append(None if position is None else offset + max(position, 0))
            position = None if position is None or data is None else position + len(data)
        return start, ids, starts


def _tail_from_boundary(vocab: ByteVocab, tail_ids: Sequence[int]) -> list[int]:
    """`tail_ids` after the last id without text, from the first restart point (else from the first
    id starting a character): committed ids whose encoding cannot depend on the text before them."""
    tail = [int(i) for i in tail_ids]
    size = len(vocab.table)
    textless = [k for k, i in enumerate(tail) if not (0 <= i < size and vocab.table[i])]
    if textless:
        tail = tail[textless[-1] + 1:]
    pieces = [vocab.table[i] for i in tail]
    joined, offsets, position = b"".join(pieces), [], 0
    for data in pieces:
        offsets.append(position)
        position += len(data)
    for k in range(1, len(tail)):
        if _is_restart(joined, offsets[k]):
            return tail[k:]
    while tail and pieces[0][0] & 0xC0 == 0x80:
        tail, pieces = tail[1:], pieces[1:]
    return tail


def retokenize_draft(target_tokenizer: Any, tail_ids: Sequence[int], draft_bytes: bytes) -> list[int]:
    """The target's ids for `draft_bytes`, a drafted text continuing the committed target ids whose
    last few are `tail_ids` (SLEM). Encodes tail text + draft text and returns what follows the tail
    when that encoding starts with the tail's ids, else the draft text encoded alone as a
    continuation; an incomplete UTF-8 end is dropped; never a special token."""
    vocab = byte_vocab(target_tokenizer)
    tail = _tail_from_boundary(vocab, tail_ids)
    if tail:
        text, _ = complete_text(vocab.text_bytes(tail) + bytes(draft_bytes))
        ids = vocab.encode(text, at_start=False)
        if ids[:len(tail)] == tail:
            return ids[len(tail):]
    text, _ = complete_text(bytes(draft_bytes))
    return vocab.encode(text, at_start=False)
