"""The n-gram drafter: its incremental index agrees with a brute-force prompt lookup."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specdec
from specdec.drafters.model_free.ngram import NgramIndex
from tiny import tiny_model


def brute_force(ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Longest n first; for it, the latest start s < len - n whose n-gram equals the tail; then
    copy k ids from s + n on, one at a time, the copy reading the ids it appends."""
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        tail = ids[len(ids) - n :]
        for start in range(len(ids) - n - 1, -1, -1):
            if ids[start : start + n] == tail:
                extended = list(ids)
                for i in range(k):
                    extended.append(extended[start + n + i])
                return extended[len(ids) :]
    return []


@given(
    ids=st.lists(st.integers(0, 3), min_size=1, max_size=60),
    chunks=st.lists(st.integers(1, 6), min_size=1, max_size=20),
    sizes=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    k=st.integers(1, 6),
)
def test_index_fed_in_chunks_matches_brute_force_after_every_chunk(ids, chunks, sizes, k):
    min_n, extra = sizes
    index = NgramIndex(min_n, min_n + extra)
    position = 0
    for size in chunks + [len(ids)]:
        index.extend(ids[position : position + size])
        position = min(len(ids), position + size)
        assert index.continuation(k) == brute_force(ids[:position], min_n, min_n + extra, k)


def test_longest_ngram_wins_over_a_more_recent_shorter_match():
    # "1 2 3" occurs at the start followed by 7; "3" alone occurs later followed by 9.
    index = NgramIndex(1, 3)
    index.extend([1, 2, 3, 7, 3, 9, 1, 2, 3])
    assert index.continuation(2) == [7, 3]


def test_a_match_near_the_end_continues_the_period_for_all_k_tokens():
    index = NgramIndex(1, 3)
    index.extend([9, 4, 5, 4, 5, 4, 5])
    assert index.continuation(5) == [4, 5, 4, 5, 4]


def test_most_recent_match_wins_among_equal_lengths():
    index = NgramIndex(2, 2)
    index.extend([5, 6, 1, 5, 6, 2, 5, 6])
    assert index.continuation(1) == [2]


def test_no_match_gives_an_empty_draft_and_generation_still_matches_plain():
    model = tiny_model("llama", vocab_size=64, seed=3)
    prompt = list(range(10, 30))  # no repeated n-gram
    plain = specdec.generate(model, prompt, max_new_tokens=12).tokens
    result = specdec.generate(model, prompt, drafter=specdec.make_drafter("ngram"), max_new_tokens=12)
    assert result.tokens == plain


@pytest.mark.parametrize("options", [{"max_ngram": 0}, {"min_ngram": 0}, {"max_ngram": 2, "min_ngram": 3},
                                     {"max_ngram": 2.5}, {"min_ngram": True}])
def test_bad_options_raise_naming_the_option(options):
    with pytest.raises(ValueError, match="ngram"):
        specdec.make_drafter("ngram", **options)


def test_drafts_live_on_the_tokens_device():
    index_drafter = specdec.make_drafter("ngram")
    model = tiny_model("llama")
    ctx = specdec.DraftContext(torch.tensor([1, 2, 1, 2, 1]), specdec.Sampling(), torch.Generator(),
                               specdec.CausalLM(model), 64)
    draft = index_drafter.propose({0: ctx}, {0: 3})[0]
    assert draft.tokens.tolist() == [2, 1, 2] and draft.tokens.device == ctx.tokens.device
