"""Tokenizer-level bridges between a draft model's and a target's vocabularies (Timor et al., ICML
2025, "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for Heterogeneous
Vocabularies"): token bytes, the token intersection map (TLI), committed ids carried id by id
(`specdec.vocab.carry`) and re-tokenisation of text (SLEM). Nothing here modifies a tokenizer or a
model; it may import no other part of specdec (it may import `specdec.vocab` alone)."""

from __future__ import annotations

from specdec.vocab.carry import IdCarrier
from specdec.vocab.mapping import VocabMap, build_map, vocab_map
from specdec.vocab.retokenize import Retokenizer, encode_bytes, retokenize_draft
from specdec.vocab.token_bytes import ByteVocab, byte_vocab, special_ids, token_bytes

__all__ = ["ByteVocab", "IdCarrier", "Retokenizer", "VocabMap", "build_map", "byte_vocab", "encode_bytes",
           "retokenize_draft", "special_ids", "token_bytes", "vocab_map"]
