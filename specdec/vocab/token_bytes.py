"""What each id of a tokenizer contributes to decoded text, as bytes: the common ground on which two
vocabularies meet (Timor et al., ICML 2025, "Accelerating LLM Inference with Lossless Speculative
Decoding Algorithms for Heterogeneous Vocabularies").

The convention is read from the fast tokenizer's backend (its decoder decides what an id means):
- byte-level (`decoders.ByteLevel`, GPT-2 and most recent LMs): each character of a vocabulary
  entry stands for one byte through GPT-2's bytes-to-unicode table (Radford et al. 2019); an entry
  with a character outside that table stands for its own UTF-8, as the decoder does;
- metaspace (sentencepiece style, Kudo & Richardson 2018: a `Metaspace` decoder, or a `Sequence` of
  `Replace("▁", " ")`, `ByteFallback`, `Fuse`, `Strip`): "▁" is a space and, with byte fallback,
  `<0xNN>` is the single byte NN. Decoding drops `stripped_spaces` leading spaces of a text (the
  dummy prefix the encoder put there), so a text's ids carry one more leading space than the text.
Added tokens that are not special carry their content's UTF-8; special tokens (bos, eos, pad, unk,
added tokens marked special) carry no text: None. Any other convention raises ValueError.
"""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ByteVocab", "byte_vocab", "special_ids", "token_bytes"]

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_LEGACY_PREFIX = "add_prefix_space"  # how older JSON spells a Metaspace prepend_scheme


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: printable bytes stand for themselves, the rest for the characters 256, 257, ..."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


BYTE_TO_CHAR: dict[int, str] = _bytes_to_unicode()
CHAR_TO_BYTE: dict[str, int] = {char: byte for byte, char in BYTE_TO_CHAR.items()}


@dataclass(frozen=True)
class ByteVocab:
    """A tokenizer seen as bytes: `table[i]` is what id i adds to decoded text (None: no text).

    `encode(text, at_start)` encodes text as plain text: special tokens are never added and never
    recognised in the text; `at_start=False` encodes a piece that continues a text, without the dummy
    prefix (a leading "▁" or "Ġ") the tokenizer puts at the start of a text. The two encoders are
    private copies of the backend, so the caller's tokenizer is never modified.
    """

    name: str                       # the tokenizer's class and name_or_path, for messages
    table: tuple[bytes | None, ...]  # [len(tokenizer)]
    special_ids: frozenset[int]
    bos_id: int | None
    eos_id: int | None
    adds_bos: bool                  # its encodings start with bos (add_special_tokens=True)
    stripped_spaces: int            # leading spaces decoding removes from a text (the dummy prefix)
    _start: Any = field(repr=False, compare=False)      # tokenizers.Tokenizer, as the tokenizer encodes
    _continue: Any = field(repr=False, compare=False)   # the same without the dummy prefix

    def encode(self, text: str, at_start: bool = True) -> list[int]:
        """The ids of `text` as plain text (no special tokens added or recognised)."""
        if not text:
            return []
        encoder = self._start if at_start else self._continue
        return encoder.encode(text, add_special_tokens=False).ids

    def text_bytes(self, ids: Any) -> bytes:
        """The bytes of `ids` joined; ids without text (specials, padding rows) add nothing."""
        size = len(self.table)
        return b"".join(self.table[i] or b"" for i in map(int, ids) if 0 <= i < size)


def describe(tokenizer: Any) -> str:
    """`ClassName('name_or_path')`, how messages name a tokenizer."""
    return f"{type(tokenizer).__name__}({getattr(tokenizer, 'name_or_path', '')!r})"


def _unsupported(tokenizer: Any, decoder: str) -> ValueError:
    return ValueError(f"{describe(tokenizer)} has decoder {decoder}; specdec maps byte-level (GPT-2 style) and "
                      "metaspace/byte-fallback (sentencepiece style) fast tokenizers, so use one of those")


def _steps(decoder: dict | None) -> list[dict]:
    if decoder is None:
        return []
    if decoder.get("type") == "Sequence":
        return [step for inner in decoder.get("decoders", []) for step in _steps(inner)]
    return [decoder]


def _convention(tokenizer: Any, spec: dict) -> tuple[str, str, bool, int]:
    """(kind, replacement, byte_fallback, stripped_spaces) of the decoder in the backend JSON `spec`."""
    steps = _steps(spec.get("decoder"))
    types = [step.get("type") for step in steps]
    shown = "+".join(map(str, types)) or "none"
    if types == ["ByteLevel"]:
        return "byte-level", "", False, 0
    replacement, stripped, fused, byte_fallback = None, 0, False, bool((spec.get("model") or {}).get("byte_fallback"))
    for step in steps:
        kind = step.get("type")
        if kind == "Metaspace":
            replacement = step.get("replacement", "▁")
            scheme = step.get("prepend_scheme", "always" if step.get(_LEGACY_PREFIX, True) else "never")
            stripped += 1 if scheme != "never" else 0
        elif kind == "Replace" and (step.get("pattern") or {}).get("String") and step.get("content") == " ":
            replacement = step["pattern"]["String"]
        elif kind == "ByteFallback":
            byte_fallback = True
        elif kind == "Fuse":
            fused = True
        elif kind == "Strip" and step.get("content") == " " and not step.get("stop") and fused:
            # after Fuse a Strip trims the start of the whole text; before it, of every token (unsupported)
            stripped += int(step.get("start", 0))
        else:
            raise _unsupported(tokenizer, shown)
    if replacement is None:
        raise _unsupported(tokenizer, shown)
    return "metaspace", replacement, byte_fallback, stripped


def _entry_bytes(token: str, kind: str, replacement: str, byte_fallback: bool) -> bytes:
    if kind == "byte-level":
        if all(char in CHAR_TO_BYTE for char in token):
            return bytes(CHAR_TO_BYTE[char] for char in token)
        return token.encode("utf-8")
    match = _BYTE_FALLBACK.fullmatch(token) if byte_fallback else None
    return bytes([int(match.group(1), 16)]) if match else token.replace(replacement, " ").encode("utf-8")


def _without_prefix(spec: dict) -> dict:
    """The backend JSON with the dummy prefix switched off (Metaspace/ByteLevel, Prepend normalizers)."""
    spec = json.loads(json.dumps(spec))

    def pre(node: dict | None) -> None:
        if not node:
            return
        if node.get("type") == "Sequence":
            for inner in node.get("pretokenizers", []):
                pre(inner)
        elif node.get("type") == "Metaspace":
            node["prepend_scheme"] = "never"
            if _LEGACY_PREFIX in node:
                node[_LEGACY_PREFIX] = False
        elif node.get("type") == "ByteLevel":
            node["add_prefix_space"] = False

    normalizer = spec.get("normalizer")
    if normalizer and normalizer.get("type") == "Prepend":
        spec["normalizer"] = None
    elif normalizer and normalizer.get("type") == "Sequence":
        normalizer["normalizers"] = [n for n in normalizer.get("normalizers", []) if n.get("type") != "Prepend"]
    pre(spec.get("pre_tokenizer"))
    return spec


def _plain_encoder(spec: dict) -> Any:
    from tokenizers import Tokenizer

    encoder = Tokenizer.from_str(json.dumps(spec))
    encoder.encode_special_tokens = True  # "<s>" in a text is three characters, never the special token
    return encoder


def _build(tokenizer: Any) -> ByteVocab:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        raise _unsupported(tokenizer, "none (not a fast tokenizer: no backend_tokenizer)")
    spec = json.loads(backend.to_str())
    kind, replacement, byte_fallback, stripped = _convention(tokenizer, spec)
    size = len(tokenizer)
    added = backend.get_added_tokens_decoder()
    model_tokens = {i: token for token, i in backend.get_vocab(with_added_tokens=False).items()}
    specials = {i for i, token in added.items() if token.special}
    specials |= {i for i in getattr(tokenizer, "all_special_ids", []) if i is not None}
    bos, eos = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)
    specials |= {i for i in (bos, eos) if i is not None}
    table: list[bytes | None] = []
    for i in range(size):
        if i in specials:
            table.append(None)
        elif i in added:
            table.append(added[i].content.encode("utf-8"))
        elif i in model_tokens:
            table.append(_entry_bytes(model_tokens[i], kind, replacement, byte_fallback))
        else:
            table.append(None)
    start = _plain_encoder(spec)
    continuation = _plain_encoder(_without_prefix(spec))
    probe = start.encode("a", add_special_tokens=True).ids
    adds_bos = bos is not None and probe[:1] == [bos] and start.encode("a", add_special_tokens=False).ids[:1] != [bos]
    return ByteVocab(describe(tokenizer), tuple(table), frozenset(specials), bos, eos, adds_bos, stripped,
                     start, continuation)


_CACHE: weakref.WeakKeyDictionary[Any, tuple[int, ByteVocab]] = weakref.WeakKeyDictionary()


def byte_vocab(tokenizer: Any) -> ByteVocab:
    """The `ByteVocab` of a transformers fast tokenizer, remembered per tokenizer object (and length)."""
    try:
        size, vocab = _CACHE.get(tokenizer, (None, None))
    except TypeError:  # not weakly referenceable or not hashable: build each time
        return _build(tokenizer)
    if vocab is None or size != len(tokenizer):
        vocab = _build(tokenizer)
        _CACHE[tokenizer] = (len(tokenizer), vocab)
    return vocab


def token_bytes(tokenizer: Any) -> tuple[bytes | None, ...]:
    """For each id in range(len(tokenizer)) the bytes it contributes to decoded text; None for specials."""
    return byte_vocab(tokenizer).table


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The ids that carry no text: bos, eos, pad, unk and added tokens marked special."""
    return byte_vocab(tokenizer).special_ids
