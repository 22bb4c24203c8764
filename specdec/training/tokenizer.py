"""A byte-level BPE tokenizer trained with the `tokenizers` library and saved so that
`transformers.AutoTokenizer` loads it (Sennrich et al. 2016, "Neural Machine Translation of Rare
Words with Subword Units"; byte-level alphabet as in GPT-2, Radford et al. 2019).

Every byte has a token, so any text encodes; `<|endoftext|>` (id 0) separates documents and is
the end-of-sequence token. Training is deterministic for the same texts and vocabulary size.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["END_OF_TEXT", "save_tokenizer", "train_tokenizer"]

END_OF_TEXT = "<|endoftext|>"


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
