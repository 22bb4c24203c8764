"""Small tokenizers for tests of vocabulary bridges, trained in-process on a few KB of the standard
library's source (no download): two with different merges and different special-token
conventions, a padded model vocabulary, tokenizers with disjoint vocabularies and an unsupported one.

- `byte_level_tokenizer`: GPT-2 style byte-level BPE (`train_tokenizer`), `<|endoftext|>` = id 0 is
  both bos and eos, no BOS added to encodings.
- `metaspace_tokenizer`: sentencepiece style BPE with byte fallback (`train_metaspace_tokenizer`),
  `<unk>`, `<s>`, `</s>` = ids 0, 1, 2, `<s>` added at the start of encodings.
Both are saved and loaded back with `AutoTokenizer`, as a user's tokenizer would be;
`legacy_metaspace_tokenizer` rewrites the metaspace one as Llama 2's tokenizer.json is written.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from specdec.data.corpus import read_text, stdlib_root
from specdec.training.tokenizer import (save_metaspace_tokenizer, save_tokenizer, train_metaspace_tokenizer,
                                        train_tokenizer)

__all__ = ["MODULES", "MULTILINGUAL", "byte_level_tokenizer", "disjoint_tokenizers", "legacy_metaspace_tokenizer",
           "metaspace_tokenizer", "padded_rows", "training_texts", "wordpiece_tokenizer"]

# Non-ASCII text both tokenizers see, so that each learns some multi-byte characters and merges.
MULTILINGUAL = ("naïve café, déjà vu; Grüße aus Köln — 日本語のテキスト, "
                "Ελληνικά κείμενα, emoji 😀 and prices in € or £.\n")


# Standard-library modules present in every CPython installation, read directly (listing the whole
# library, as stdlib_corpus() does, takes seconds).
MODULES = ("bisect.py", "colorsys.py", "fnmatch.py", "copy.py", "glob.py", "textwrap.py", "shlex.py", "heapq.py")


@functools.lru_cache(maxsize=1)
def training_texts(chars: int = 4_000) -> tuple[str, ...]:
    """The first `chars` characters of each of MODULES (the same on every run of one installation)."""
    return tuple(read_text(stdlib_root() / name)[:chars] for name in MODULES)


def byte_level_tokenizer(directory: Path, vocab_size: int = 384) -> Any:
    """A byte-level BPE trained on the even files (and MULTILINGUAL), loaded with AutoTokenizer."""
    from transformers import AutoTokenizer

    texts = [*training_texts()[0::2], MULTILINGUAL * 4]
    save_tokenizer(train_tokenizer(texts, vocab_size), directory, max_length=512)
    return AutoTokenizer.from_pretrained(directory)


def metaspace_tokenizer(directory: Path, vocab_size: int = 512) -> Any:
    """A metaspace BPE with byte fallback trained on the odd files (and MULTILINGUAL), loaded with
    AutoTokenizer."""
    from transformers import AutoTokenizer

    texts = [*training_texts()[1::2], MULTILINGUAL * 4]
    save_metaspace_tokenizer(train_metaspace_tokenizer(texts, vocab_size), directory, max_length=512)
    return AutoTokenizer.from_pretrained(directory)


def legacy_metaspace_tokenizer(metaspace: Any) -> Any:
    """`metaspace` written the way Llama 2's tokenizer.json is: no pre-tokenizer, and normalizers
    Prepend("▁") then Replace(" ", "▁"), so every text gets the dummy prefix, even one that starts
    with a space. The same vocabulary, merges, decoder and BOS."""
    import json

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(metaspace.backend_tokenizer.to_str())
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    spec["pre_tokenizer"] = None
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


def padded_rows(tokenizer: Any, multiple: int = 64) -> int:
    """A model vocabulary padded past the tokenizer: len(tokenizer) rounded up to `multiple`, plus
    `multiple` (so that there are always padding rows), as models pad theirs for fast matmuls."""
    return (len(tokenizer) + multiple - 1) // multiple * multiple + multiple


def _wrap(tokenizer: Any, eos: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos)


def disjoint_tokenizers() -> tuple[Any, Any]:
    """(letters, digits): a byte-level tokenizer of lowercase letters and a metaspace tokenizer of
    digits; their only common id is end-of-sequence."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    letters = Tokenizer(models.BPE(vocab={**{chr(c): c - 97 for c in range(97, 123)}, "<eos>": 26}, merges=[]))
    letters.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    letters.decoder = decoders.ByteLevel()
    digits = Tokenizer(models.BPE(vocab={**{str(d): d for d in range(10)}, "</s>": 10}, merges=[]))
    digits.pre_tokenizer = pre_tokenizers.Metaspace()
    digits.decoder = decoders.Metaspace()
    return _wrap(letters, "<eos>"), _wrap(digits, "</s>")


def wordpiece_tokenizer() -> Any:
    """A BERT-style WordPiece tokenizer: a convention specdec.vocab does not map."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[SEP]": 1, "a": 2, "b": 3, "##b": 4}
    tokenizer = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    return _wrap(tokenizer, "[SEP]")
