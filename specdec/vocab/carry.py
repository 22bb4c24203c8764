"""Committed target ids carried to a draft model with another vocabulary, the way token-level
intersection (TLI; Timor et al., ICML 2025) drafts: id by id where the vocabularies share the id.

An id both vocabularies share (`specdec.vocab.mapping.VocabMap`) reaches the draft model as its
draft id, so a draft token the verifier accepts is carried exactly as it was drafted and fed: the
draft model's cache never has to be re-aligned after an acceptance. A run of ids the draft
vocabulary lacks reaches it through its text, encoded by the draft tokenizer as a piece continuing
the text (`ByteVocab.encode`): never an unknown-token id, never a BOS or EOS inserted mid-stream.
An incomplete UTF-8 tail of such a run waits for the ids that finish it (a shared id that comes
first closes it, replaced). The target's BOS at position 0 becomes the draft's when the draft
tokenizer starts its encodings with one; end-of-sequence is shared, id for id.

(SLEM carries the text instead, in the draft tokenizer's canonical ids: `Retokenizer`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specdec.vocab.mapping import VocabMap
from specdec.vocab.retokenize import complete_text
from specdec.vocab.token_bytes import ByteVocab, byte_vocab

__all__ = ["IdCarrier"]


class IdCarrier:
    """The draft model's ids for a growing sequence of committed target ids (module docstring).
    Same interface as `Retokenizer`: `reset`, `extend` (which only appends) and `ids`."""

    def __init__(self, vocab: VocabMap, target_tokenizer: Any, draft_tokenizer: Any) -> None:
        self.to_draft: list[int] = vocab.target_to_draft.tolist()  # [V_target], -1 where unshared
        self.source: ByteVocab = byte_vocab(target_tokenizer)
        self.dest: ByteVocab = byte_vocab(draft_tokenizer)
        self.reset([])

    @property
    def ids(self) -> list[int]:
        return list(self._ids)

    @property
    def pending_bytes(self) -> bytes:
        """The bytes of unshared ids not yet encoded (an incomplete UTF-8 tail)."""
        return bytes(self._pending)

    def reset(self, source_ids: Sequence[int]) -> None:
        """Start over with the prompt `source_ids`."""
        self._ids: list[int] = []
        self._pending = bytearray()
        self._strip = self.source.stripped_spaces  # the target's dummy prefix, which decoding drops
        ids = [int(i) for i in source_ids]
        if ids and self.source.bos_id is not None and ids[0] == self.source.bos_id \
                and self.to_draft[ids[0]] < 0:
            if self.dest.adds_bos and self.dest.bos_id is not None:
                self._ids.append(self.dest.bos_id)
            ids = ids[1:]
        self._start = len(self._ids)  # ids before it are the BOS: text after it is a text's start
        self.extend(ids)

    def extend(self, source_ids: Sequence[int]) -> int:
        """Append committed target ids; returns where the new draft ids begin (nothing before
        changes)."""
        first = len(self._ids)
        table = self.source.table
        for i in map(int, source_ids):
            draft = self.to_draft[i] if 0 <= i < len(self.to_draft) else -1
            if draft >= 0:
                self._flush(final=True)
                self._ids.append(draft)
                self._strip = 0
                continue
            data = table[i] if 0 <= i < len(table) else None
            if data:  # an unshared id with text; specials and padding rows carry none
                self._pending += data
        self._flush(final=False)
        return first

    def _flush(self, final: bool) -> None:
        """Encode the pending bytes (their complete UTF-8 unless `final`, which replaces the rest)."""
        while self._strip and self._pending[:1] == b" ":
            del self._pending[0]
            self._strip -= 1
        if not self._pending:
            return
        self._strip = 0
        if final:
            text, used = bytes(self._pending).decode("utf-8", errors="replace"), len(self._pending)
        else:
            text, used = complete_text(bytes(self._pending))
        if text:
            self._ids += self.dest.encode(text, at_start=len(self._ids) == self._start)
        del self._pending[:used]
