"""A draft model whose tokenizer is not the target's (Timor et al., ICML 2025, "Accelerating LLM
Inference with Lossless Speculative Decoding Algorithms for Heterogeneous Vocabularies").

Two ways to carry a draft across, both lossless at any temperature:

- TLI (token-level intersection): the draft model's logits are restricted to the ids both
  vocabularies share (`specdec.vocab.mapping.VocabMap`; -inf elsewhere, so the softmax
  renormalises over the shared ids) and laid out in the target's vocabulary. Tokens are drawn
  from that distribution, which is the q the verifier receives: the ordinary `min(1, p/q)` rule
  stays exact, and trees work as with any sampled drafter. The draft model is fed the drawn
  tokens by their own ids (every drawn id is shared).
- SLEM (string-level exact match): the draft model drafts in its own vocabulary (its argmax:
  a deterministic proposal), its text is re-tokenised by the target's tokenizer after the last
  committed ids (`specdec.vocab.retokenize.retokenize_draft`), and those ids are verified by
  sample-and-match (a draft without q), exact for any pair of vocabularies.

The committed ids reach the draft model as TLI drafts them under TLI: an id both vocabularies
share as its draft id, so an accepted draft is carried exactly as it was drafted, and a run of
ids they do not share through its text (`specdec.vocab.carry.IdCarrier`); under SLEM as its
text, in the draft tokenizer's canonical ids (`specdec.vocab.retokenize.Retokenizer`). Either
way never as an unknown token, and no BOS or EOS is inserted mid-stream. After each commit the
draft model's cache keeps the longest prefix of what it holds that the new ids still begin with
(`common_prefix`) and runs the rest.

`translate="auto"` picks TLI when the generation samples and SLEM when it is greedy, and SLEM
wherever the vocabularies share no text token (`resolve_translate`; `docs/drafters.md` gives the
measurements behind the rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdec.types import Sampling, static_capacity
from specdec.vocab.carry import IdCarrier
from specdec.vocab.mapping import VocabMap, vocab_map
from specdec.vocab.retokenize import Retokenizer, retokenize_draft
from specdec.vocab.token_bytes import token_bytes

__all__ = ["TRANSLATIONS", "Translation", "common_prefix", "load_draft_tokenizer", "resolve_translate",
           "same_vocabulary"]

TRANSLATIONS = ("auto", "tli", "slem")
TAIL = 8  # committed target ids SLEM re-tokenises its draft after (`retokenize_draft`)


def resolve_translate(option: str, sampling: Sampling, tree: bool = False) -> str:
    """The translation a generation uses: `option` unless "auto", which is TLI for trees (SLEM
    drafts chains) and when sampling, and SLEM for greedy chains. Measured on the zoo (`docs/drafters.md`): with a draft model that guesses the
    target's text well, SLEM's argmax chain re-tokenised at the target's own token boundaries is
    accepted more at temperature 0, and TLI's sampled draft over the shared tokens more when
    sampling. Under "auto" the drafter falls back to SLEM when the vocabularies share no text token
    (`specdec.vocab.mapping.NoSharedTokens`)."""
    if option not in TRANSLATIONS:
        raise ValueError(f"draft-model: translate must be one of {', '.join(TRANSLATIONS)}, got {option!r}")
    if option != "auto":
        return option
    return "slem" if sampling.greedy and not tree else "tli"


def common_prefix(held: Sequence[int], ids: Sequence[int]) -> int:
    """How many leading ids `held` and `ids` share."""
    n = 0
    for a, b in zip(held, ids):
        if a != b:
            break
        n += 1
    return n


def load_draft_tokenizer(tokenizer: Any, model: Any) -> Any:
    """The draft model's tokenizer: `tokenizer` (an object, or a directory or hub id to load), else
    the one saved beside a model given as a directory or held in a model given as a GGUF file
    (None when there is none)."""
    from specdec.checkpoints import is_gguf, load_tokenizer, resolve_checkpoint

    if tokenizer is not None and not isinstance(tokenizer, (str, Path)):
        return tokenizer
    if tokenizer is not None:
        return load_tokenizer(tokenizer)
    if isinstance(model, (str, Path)):
        directory = resolve_checkpoint(model, "draft-model model")
        if is_gguf(directory):  # the file's metadata holds its tokenizer
            return load_tokenizer(directory)
        if any((directory / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            return load_tokenizer(directory)
    return None


def same_vocabulary(draft_tokenizer: Any, target_tokenizer: Any, draft_vocab: int, target_vocab: int) -> bool:
    """Whether the two tokenizers give every id the same token and the same special ids (and the
    models the same rows): then the draft model drafts on the target's ids directly."""
    if draft_vocab != target_vocab:
        return False
    if draft_tokenizer is target_tokenizer:
        return True
    specials = ("eos_token_id", "bos_token_id", "unk_token_id")
    return all(getattr(draft_tokenizer, name, None) == getattr(target_tokenizer, name, None) for name in specials) \
        and draft_tokenizer.get_vocab() == target_tokenizer.get_vocab()


@dataclass
class Translation:
    """One generation's bridge from the target's ids to a draft model with another tokenizer.

    `ids` are the draft model's ids for the committed text (updated by `follow`); `held` the
    ids its KV cache holds, position by position, as the drafter last left it.
    """

    mode: str  # "tli" or "slem"
    vocab: VocabMap | None  # TLI's map (None under SLEM, which needs no shared ids)
    draft_tokenizer: Any
    target_tokenizer: Any
    carrier: IdCarrier | Retokenizer | None  # the committed ids in the draft model's (None: not made yet)
    draft_bytes: tuple[bytes | None, ...]  # the text of each draft id (`token_bytes`)
    seen: int = 0  # committed target ids carried into `carrier`
    held: list[int] = field(default_factory=list)

    @classmethod
    def between(cls, mode: str, draft_tokenizer: Any, target_tokenizer: Any, draft_vocab: int, target_vocab: int,
                device: torch.device) -> Translation:
        """The bridge for `mode` ("tli" or "slem"); TLI builds (or reads from its cache) the vocabulary map."""
        vocab = vocab_map(draft_tokenizer, target_tokenizer, draft_vocab, target_vocab).to(device) \
            if mode == "tli" else None
        bridge = cls(mode, vocab, draft_tokenizer, target_tokenizer, None, token_bytes(draft_tokenizer))
        return bridge.fresh()

    def fresh(self) -> Translation:
        """The same bridge with no generation's state (a batch row's own alignment): TLI carries
        the committed ids id by id (`IdCarrier`), SLEM their text (`Retokenizer`)."""
        carrier: IdCarrier | Retokenizer = IdCarrier(self.vocab, self.target_tokenizer, self.draft_tokenizer) \
            if self.vocab is not None else Retokenizer(self.target_tokenizer, self.draft_tokenizer)
        return Translation(self.mode, self.vocab, self.draft_tokenizer, self.target_tokenizer, carrier,
                           self.draft_bytes)

    @staticmethod
    def capacity(target_capacity: int) -> int:
        """A static cache for the draft model's ids of a generation whose target needs
        `target_capacity` positions: twice as many (a tokenizer that needs more than twice the
        target's ids for the same text drafts nothing once its cache is full)."""
        return static_capacity(2 * target_capacity)

    @property
    def _carrier(self) -> IdCarrier | Retokenizer:
        assert self.carrier is not None, "a Translation is used through fresh()"
        return self.carrier

    @property
    def ids(self) -> list[int]:
        return self._carrier.ids

    def start(self, tokens: torch.Tensor) -> list[int]:
        """Carry the prompt's ids [T] (a new generation); the draft model's ids for its text."""
        self._carrier.reset(tokens.tolist())
        self.seen = tokens.shape[0]
        self.held = []
        return self.ids

    def follow(self, tokens: torch.Tensor) -> list[int]:
        """Carry the ids committed since the last call (tokens [T] is the whole committed sequence)."""
        if tokens.shape[0] > self.seen:
            self._carrier.extend(tokens[self.seen :].tolist())
            self.seen = tokens.shape[0]
        return self.ids

    def target_ids(self, draft_ids: Sequence[int], committed: torch.Tensor, k: int) -> list[int]:
        """SLEM: the target's ids [<= k] for the text of the draft model's `draft_ids`, re-tokenised
        after the last committed target ids."""
        text = b"".join(self.draft_bytes[i] or b"" for i in draft_ids if 0 <= i < len(self.draft_bytes))
        tail = committed[-TAIL:].tolist()
        return retokenize_draft(self.target_tokenizer, tail, text)[:k]
