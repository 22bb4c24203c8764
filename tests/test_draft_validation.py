"""validate_draft catches every way a drafter can break its promise, and names the drafter."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import ClassVar

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec.protocols import DraftContext
from specdec.types import Draft, Sampling
from specdec.verifier import DraftError, validate_draft
from strategies import ChainCase, chain_drafts
from tiny import tiny_model

NAME = "my-broken-drafter"
CPU = torch.device("cpu")


def softmax_rows(k: int, vocab_size: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, k * vocab_size).reshape(k, vocab_size).softmax(-1)  # (k, V)


def with_probs(tokens: list[int], vocab_size: int, edit: Callable[[torch.Tensor], torch.Tensor]) -> Draft:
    return Draft(torch.tensor(tokens), edit(softmax_rows(len(tokens), vocab_size)))


def set_entry(row: int, column: int, value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def edit(probs: torch.Tensor) -> torch.Tensor:
        probs[row, column] = value
        return probs
    return edit


def shift_mass(row: int, source: int, sink: int, amount: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def edit(probs: torch.Tensor) -> torch.Tensor:
        probs[row, source] -= amount
        probs[row, sink] += amount
        return probs
    return edit


# Each maker builds a broken draft for a drafter allowed k tokens over a vocabulary of V.
BROKEN: dict[str, Callable[[int, int], object]] = {
    "not a Draft": lambda k, V: [1, 2],
    "a bare tensor": lambda k, V: torch.tensor([1, 2]),
    "None": lambda k, V: None,
    "tokens a list": lambda k, V: Draft([1, 2]),  # type: ignore[arg-type]
    "2-D tokens": lambda k, V: Draft(torch.tensor([[1, 2]])),
    "0-D tokens": lambda k, V: Draft(torch.tensor(1)),
    "float tokens": lambda k, V: Draft(torch.tensor([1.0, 2.0])),
    "int32 tokens": lambda k, V: Draft(torch.tensor([1, 2], dtype=torch.int32)),
    "tokens on another device": lambda k, V: Draft(torch.zeros(2, dtype=torch.long, device="meta")),
    "too many tokens": lambda k, V: Draft(torch.zeros(k + 1, dtype=torch.long)),
    "negative id": lambda k, V: Draft(torch.tensor([1, -1])),
    "id == V": lambda k, V: Draft(torch.tensor([V, 0])),
    "id > V": lambda k, V: Draft(torch.tensor([0, V + 5])),
    "probs missing a row": lambda k, V: Draft(torch.tensor([1, 2]), softmax_rows(1, V)),
    "probs too wide": lambda k, V: Draft(torch.tensor([1, 2]), softmax_rows(2, V + 1)),
    "probs 1-D": lambda k, V: Draft(torch.tensor([1]), softmax_rows(1, V)[0]),
    "probs for an empty draft": lambda k, V: Draft(torch.zeros(0, dtype=torch.long), softmax_rows(1, V)),
    "probs a list": lambda k, V: Draft(torch.tensor([1]), softmax_rows(1, V).tolist()),  # type: ignore
    "integer probs": lambda k, V: Draft(torch.tensor([1]), torch.nn.functional.one_hot(torch.tensor([1]), V)),
    "NaN probs": lambda k, V: with_probs([1, 2], V, set_entry(1, 0, float("nan"))),
    "inf probs": lambda k, V: with_probs([1, 2], V, set_entry(0, 3, float("inf"))),
    "negative probs": lambda k, V: with_probs([1, 2], V, shift_mass(0, 3, 4, 0.5)),  # sums stay 1
    "rows not summing to 1": lambda k, V: with_probs([1, 2], V, lambda q: q * 0.5),
    "logits instead of probs": lambda k, V: Draft(torch.tensor([1, 2]),
                                                  torch.linspace(-3, 3, 2 * V).reshape(2, V)),
    "q(d) = 0": lambda k, V: Draft(torch.tensor([1, 2]), torch.eye(V)[[1, 3]]),  # row 1 one-hot at 3, d = 2
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_broken_draft_raises_draft_error_naming_the_drafter(kind: str) -> None:
    k, vocab_size = 4, 10
    draft = BROKEN[kind](k, vocab_size)
    with pytest.raises(DraftError, match=re.escape(NAME)):
        validate_draft(draft, k, vocab_size, CPU, NAME)


@pytest.mark.parametrize(("kind", "bad_id"), [("negative id", -1), ("id == V", 10), ("id > V", 15)])
def test_out_of_vocabulary_error_names_the_bad_id(kind: str, bad_id: int) -> None:
    with pytest.raises(DraftError, match=re.escape(str(bad_id))):
        validate_draft(BROKEN[kind](4, 10), 4, 10, CPU, NAME)


def test_draft_error_is_a_value_error() -> None:
    assert issubclass(DraftError, ValueError)


@pytest.mark.parametrize("probs_dtype", [None, torch.float32, torch.float64])
def test_empty_draft_is_valid(probs_dtype: torch.dtype | None) -> None:
    probs = None if probs_dtype is None else torch.zeros(0, 10, dtype=probs_dtype)
    validate_draft(Draft(torch.zeros(0, dtype=torch.long), probs), 4, 10, CPU, NAME)
    validate_draft(Draft(torch.zeros(0, dtype=torch.long), probs), 0, 10, CPU, NAME)


@settings(max_examples=60)
@given(chain_drafts(), st.sampled_from([torch.float32, torch.float64]))
def test_well_formed_drafts_are_valid(case: ChainCase, dtype: torch.dtype) -> None:
    """Deterministic drafts with any in-vocabulary ids; sampled drafts whose tokens lie in q's support."""
    vocab_size = case.p.shape[1]
    probs = None if case.q is None else case.q.to(dtype)
    validate_draft(Draft(case.tokens, probs), case.k, vocab_size, CPU, NAME)
    validate_draft(Draft(case.tokens, probs), case.k + 3, vocab_size, CPU, NAME)


def test_float32_probs_within_rounding_of_one_are_valid() -> None:
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0))
    probs = logits.softmax(-1)  # (3, V) float32: row sums off by rounding only
    validate_draft(Draft(probs.argmax(-1), probs), 3, 1000, CPU, NAME)


# --- end to end: the decode loop refuses a broken drafter ------------------------------------------

VOCAB = 32
END_TO_END = ["not a Draft", "2-D tokens", "float tokens", "tokens on another device", "too many tokens",
              "negative id", "id == V",
              "probs too wide", "NaN probs", "negative probs", "rows not summing to 1", "q(d) = 0"]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_model("llama", vocab_size=VOCAB, seed=0, dtype=torch.float32, layers=1, hidden=16)


def broken_drafter(kind: str) -> object:
    class Broken:
        name: ClassVar[str] = f"broken-{kind.replace(' ', '-')}"

        def propose(self, ctx: DraftContext, k: int) -> object:
            return BROKEN[kind](k, ctx.vocab_size)

    return Broken()


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0)], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", END_TO_END)
def test_generate_with_broken_drafter_raises_naming_it(target: torch.nn.Module, kind: str,
                                                       sampling: Sampling) -> None:
    drafter = broken_drafter(kind)
    with pytest.raises(DraftError, match=re.escape(drafter.name)):
        specdec.generate(target, [1, 2, 3], drafter=drafter, num_draft_tokens=3, max_new_tokens=8,
                         sampling=sampling, seed=0)
