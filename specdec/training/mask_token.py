"""Choosing the id whose (frozen) target embedding fills a block drafter's masked slots (DFlash,
Chen et al. 2026, arXiv 2602.06036): a row of the target's embedding table that the tokenizer never
produces, so that a committed token never looks like a mask.

In order of preference:
1. the tokenizer's own mask token (`mask_token`, or `<|MASK|>`, the token SpecForge adds and
   SGLang looks up by default);
2. the first padding row past the tokenizer's ids (len(tokenizer) < embedding rows): the z-lab
   Qwen3 drafters' 151669 of 151936;
3. a token standing for one byte that UTF-8 text never holds (0xC0, 0xC1, 0xF5..0xFF): byte-level
   BPE tokenizers (GPT-2's alphabet) and byte-fallback tokenizers (`<0xFF>`) have all 256 bytes,
   and encoding text can never produce these. The zoo's targets have no padding rows, so they get
   this one.
Otherwise there is no free row, and the caller must name one.
"""

from __future__ import annotations

from typing import Any

from specdec.vocab import token_bytes

__all__ = ["MASK_TOKEN", "NEVER_IN_UTF8", "check_mask_token", "choose_mask_token"]

MASK_TOKEN = "<|MASK|>"
NEVER_IN_UTF8 = frozenset({0xC0, 0xC1, *range(0xF5, 0x100)})  # bytes no UTF-8 encoding holds


def check_mask_token(mask_token_id: int, rows: int, target: str) -> int:
    """`mask_token_id` when it is a row of the target's embedding table [rows, H], else ValueError."""
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int) or not 0 <= mask_token_id < rows:
        raise ValueError(f"dflash: mask token id {mask_token_id!r} is not a row of the embedding table of "
                         f"{target} (ids 0..{rows - 1}); pass --mask-token-id, an id the tokenizer never produces")
    return mask_token_id


def _named_mask(tokenizer: Any, rows: int) -> int | None:
    named = getattr(tokenizer, "mask_token_id", None)
    if isinstance(named, int) and 0 <= named < rows:
        return named
    found = tokenizer.get_vocab().get(MASK_TOKEN)
    return found if isinstance(found, int) and 0 <= found < rows else None


def _impossible_byte(tokenizer: Any, rows: int) -> int | None:
    """The lowest id standing for a single byte UTF-8 never holds, or None."""
    try:
        table = token_bytes(tokenizer)
    except ValueError:  # a convention specdec.vocab does not read: no byte tokens known
        return None
    found = [i for i, text in enumerate(table) if i < rows and text is not None and len(text) == 1
             and text[0] in NEVER_IN_UTF8]
    return min(found) if found else None


def choose_mask_token(tokenizer: Any, rows: int, target: str) -> int:
    """The mask id for a target whose embedding table has `rows` rows (module docstring), or
    ValueError naming `target` and --mask-token-id when the table has no row the tokenizer never
    produces."""
    for choice in (_named_mask(tokenizer, rows), len(tokenizer) if len(tokenizer) < rows else None,
                   _impossible_byte(tokenizer, rows)):
        if choice is not None:
            return choice
    raise ValueError(f"dflash: the embedding table of {target} ({rows} rows) has no row its tokenizer "
                     f"({len(tokenizer)} ids) never produces: no {MASK_TOKEN} token, no padding rows and no "
                     "token of a byte UTF-8 never holds; pass --mask-token-id, an id the text rarely holds")
