"""Grammar-constrained output (`Sampling.json_schema`, `regex`, `grammar`) through xgrammar
(Dong et al. 2024, "XGrammar: Flexible and Efficient Structured Generation Engine for Large
Language Models"): its compiler turns the constraint and the tokenizer's vocabulary into a
pushdown automaton with precomputed token masks, its matcher accepts ids and rolls them back.

Under speculation each verify row needs the mask of its own prefix. The matcher holds the
committed ids; for the rows of a draft it accepts the row's suffix, reusing what the row before
it accepted (a chain's rows extend each other by one id, a tree's rows are visited root first,
so the matcher moves along the tree's edges), fills the row's mask and finally rolls back to the
committed state: each step costs one accept and one mask per row, never a re-parse from the
start. A row whose suffix the grammar rejects is never reached by the verifier (its parent's p
gives the offending id probability 0), so it is left unmasked.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from specdec.processing.prefixes import Prefixes

__all__ = ["ConstraintError", "Matcher", "compile_constraint"]


class ConstraintError(ValueError):
    """A constraint the grammar engine cannot compile, or a tokenizer it cannot read."""


def compile_constraint(kind: str, text: str, tokenizer: Any, vocab_size: int) -> Any:
    """xgrammar's compiled grammar of a constraint (`Sampling.constraint`) for the tokenizer;
    compiled grammars are cached per tokenizer and vocabulary size."""
    compiler = _compiler(_TokenizerKey(tokenizer), vocab_size)
    try:
        if kind == "json_schema":  # one line as json.dumps writes it (", " and ": "): whitespace a model
            return compiler.compile_json_schema(text, any_whitespace=False)  # could pad with forever is not offered
        if kind == "regex":
            return compiler.compile_regex(text)
        return compiler.compile_grammar(text)
    except Exception as error:  # xgrammar reports a bad schema, regex or grammar as RuntimeError or ValueError
        raise ConstraintError(f"Sampling.{kind} does not compile: {str(error).strip()[:400]}") from error


class _TokenizerKey:
    """A tokenizer as a cache key: by identity (tokenizers are not hashable by value)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __hash__(self) -> int:
        return id(self.tokenizer)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TokenizerKey) and other.tokenizer is self.tokenizer


@functools.lru_cache(maxsize=8)
def _compiler(key: _TokenizerKey, vocab_size: int) -> Any:
    import xgrammar

    tokenizer = key.tokenizer
    if tokenizer is None:
        raise ConstraintError("a constraint (json_schema, regex, grammar) needs the target's tokenizer: pass "
                              "tokenizer= to specdec.generate")
    try:
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    except Exception as error:
        raise ConstraintError(f"the grammar engine cannot read tokenizer {type(tokenizer).__name__}: "
                              f"{str(error).strip()[:300]}; constraints need a transformers tokenizer "
                              "(PreTrainedTokenizerFast, or a slow one with a vocabulary)") from error
    return xgrammar.GrammarCompiler(info, max_threads=1)


class Matcher:
    """The constraint's state over one generation's committed ids, and the masks of a draft's rows."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar

        self._xgrammar = xgrammar
        self._matcher = xgrammar.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)  # (1, ceil(V / 32)) int32
        self._bits = torch.arange(32, dtype=torch.int32)

    @property
    def stop_ids(self) -> list[int]:
        """The ids that end the output once the grammar is complete (the tokenizer's EOS)."""
        return list(self._matcher.stop_token_ids)

    def advance(self, tokens: list[int]) -> None:
        """Accept committed ids (they were drawn from masked distributions, so the grammar allows them).

        An output can reach a dead end: a state where the grammar goes on but no id of the vocabulary
        spells any of its continuations (the engine allows an id whose text the grammar can extend,
        not one that some ids can finish). Plain sampling fails there too; the id after it is refused
        with that reason."""
        for token in tokens:
            if self._matcher.is_terminated():
                return  # past the stop id: the generation has ended
            if not self._matcher.accept_token(int(token)):
                if not self._mask().any():
                    raise ConstraintError(f"the constraint allows no id of the tokenizer's vocabulary after the "
                                          "output so far: the vocabulary cannot spell what the grammar needs next "
                                          f"(id {token} was drawn from the unconstrained row); give a constraint "
                                          "this tokenizer can finish")
                raise ConstraintError(f"the constraint's matcher rejected committed id {token}: the output left "
                                      "the grammar (a drafter or processor changed committed ids?)")

    def masks(self, prefixes: Prefixes) -> torch.Tensor:
        """allowed [R, V] (bool, on the host): what the grammar allows after each row's prefix."""
        rows = prefixes.rows
        allowed = torch.ones(rows, self.vocab_size, dtype=torch.bool)
        current: list[int] = []  # the suffix the matcher holds beyond the committed ids
        matcher = self._matcher
        for r in range(rows):
            suffix = prefixes.suffix(r)
            common = 0
            while common < min(len(current), len(suffix)) and current[common] == suffix[common]:
                common += 1
            if len(current) > common:
                matcher.rollback(len(current) - common)
                del current[common:]
            reached = True
            for token in suffix[common:]:
                if matcher.is_terminated() or not matcher.accept_token(int(token)):
                    reached = False
                    break
                current.append(token)
            if reached and not matcher.is_terminated():
                mask = self._mask()
                if mask.any():  # a dead end stays unmasked: committing any id there fails (`advance`)
                    allowed[r] = mask
        if current:
            matcher.rollback(len(current))
        return allowed

    def _mask(self) -> torch.Tensor:
        """The matcher's next-id mask as bool [V]."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        bits = (self._bitmask[0].unsqueeze(-1) >> self._bits) & 1  # (ceil(V / 32), 32)
        return bits.flatten()[: self.vocab_size].bool()
