"""Two BPE tokenizers trained with the `tokenizers` library and saved so that
`transformers.AutoTokenizer` loads them (Sennrich et al. 2016, "Neural Machine Translation of Rare
Words with Subword Units").

Byte-level (`train_tokenizer`, the alphabet of GPT-2, Radford et al. 2019): every byte has a token,
so any text encodes; `<|endoftext|>` (id 0) separates documents and is the end-of-sequence token.

Metaspace (`train_metaspace_tokenizer`, sentencepiece style as in Llama 2; Kudo & Richardson 2018):
spaces become "▁" and a text gets a leading "▁" (the dummy prefix, which decoding strips); a
character outside the vocabulary falls back to its UTF-8 bytes, the 256 tokens `<0x00>`..`<0xFF>`;
`<unk>`, `<s>` and `</s>` are ids 0, 1, 2. A vocabulary differently segmented and differently
marked than the byte-level one: the other side of specdec.vocab's bridges.

Training is deterministic for the same texts and vocabulary size.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["END_OF_TEXT", "METASPACE", "SENTENCE_END", "SENTENCE_START", "UNKNOWN", "save_metaspace_tokenizer",
           "save_tokenizer", "train_metaspace_tokenizer", "train_tokenizer"]

END_OF_TEXT = "<|endoftext|>"
UNKNOWN, SENTENCE_START, SENTENCE_END = "<unk>", "<s>", "</s>"  # the metaspace tokenizer's ids 0, 1, 2
METASPACE = "\u2581"  # "▁", a space inside metaspace tokens


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """A `tokenizers.Tokenizer` with `vocab_size` entries (256 bytes + merges + `<|endoftext|>`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 258:
        raise ValueError(f"vocab_size must be an int >= 258 (256 bytes, <|endoftext|> and a merge), "
                         f"got {vocab_size!r}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def save_tokenizer(tokenizer: Any, path: str | Path, max_length: int) -> Path:
    """Write `tokenizer` (a `tokenizers.Tokenizer`) to the directory `path` for AutoTokenizer."""
    from transformers import PreTrainedTokenizerFast

    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=END_OF_TEXT, bos_token=END_OF_TEXT,
                                      model_max_length=max_length)
    wrapped.save_pretrained(str(directory))
    return directory


def train_metaspace_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """A sentencepiece-style `tokenizers.Tokenizer`: `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then
    the characters and merges learned from `texts`, `vocab_size` entries in all (more only when the
    texts hold more distinct characters than that leaves room for)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, trainers

    specials = [UNKNOWN, SENTENCE_START, SENTENCE_END]
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < len(specials) + 256 + 2:
        raise ValueError(f"vocab_size must be an int >= 261 (<unk>, <s>, </s>, 256 bytes and two learned "
                         f"tokens), got {vocab_size!r}")
    learner = Tokenizer(models.BPE(unk_token=UNKNOWN))
    learner.pre_tokenizer = _metaspace_pre_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 256, special_tokens=specials, show_progress=False)
    learner.train_from_iterator(texts, trainer)
    learned = json.loads(learner.to_str())["model"]
    vocab = {token: i for i, token in enumerate(specials + [f"<0x{byte:02X}>" for byte in range(256)])}
    for token, _ in sorted(learned["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(pair) if isinstance(pair, list) else tuple(pair.split(" ")) for pair in learned["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=UNKNOWN, byte_fallback=True))
    tokenizer.pre_tokenizer = _metaspace_pre_tokenizer()
    tokenizer.decoder = decoders.Sequence([decoders.Replace(METASPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    return tokenizer


def _metaspace_pre_tokenizer() -> Any:
    from tokenizers import pre_tokenizers

    # split=True: no token spans a space (sentencepiece's split_by_whitespace); "always": the dummy prefix
    return pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always", split=True)


def save_metaspace_tokenizer(tokenizer: Any, path: str | Path, max_length: int) -> Path:
    """Write a `train_metaspace_tokenizer` tokenizer to the directory `path` for AutoTokenizer. Like
    the sentencepiece tokenizers of Llama 2 and Mistral, its encodings start with `<s>` (with
    add_special_tokens=True, the default) and never end with `</s>`."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    copy = Tokenizer.from_str(tokenizer.to_str())  # the wrapper installs its post-processor on the copy
    wrapped = PreTrainedTokenizerFast(tokenizer_object=copy, bos_token=SENTENCE_START, eos_token=SENTENCE_END,
                                      unk_token=UNKNOWN, add_bos_token=True, model_max_length=max_length)
    wrapped.save_pretrained(str(directory))
    return directory
