"""Degenerate loops in generated text and the accepted tokens they gave (`specdec.data.loops`)."""

from __future__ import annotations

import pytest

from specdec.data.loops import loop_count, loop_mask


def test_a_loop_is_marked_from_its_first_repeat_on():
    period = [5, 6, 7]
    tokens = [1, 2, 3, 4] + period * 6
    mask = loop_mask(tokens, n=4)
    assert not any(mask[:7])  # the 4-gram starting at 7 (5 6 7 5) is the first to repeat one (at 4)
    assert all(mask[7:])  # and every token from there on lies in a repeated 4-gram
    assert sum(mask) / len(mask) > 0.5


def test_text_without_a_repeated_ngram_has_no_loop():
    assert loop_mask(list(range(50)), n=4) == [False] * 50
    assert loop_mask([1, 2, 1, 2, 3], n=3) == [False] * 5  # a repeated pair is not a repeated 3-gram


def test_accepted_tokens_are_laid_out_step_by_step():
    tokens = [9, 8] + [1, 2, 3, 4] * 4  # 18 tokens; loop tokens from index 6 on (n = 4)
    mask = loop_mask(tokens, n=4)
    steps = [1, 0, 4, 4, 3]  # each step emits accepted + 1: 2 + 1 + 5 + 5 + 4 = 17, then a last step
    count = loop_count(tokens, steps + [0], n=4)
    assert count.tokens == 18 and count.loop_tokens == sum(mask)
    assert count.accepted == 12
    # step 3 emits tokens 3..7 (accepted 3..6), step 4 tokens 8..12 (accepted 8..11), step 5 13..16 (13..15)
    expected = sum(mask[3:7]) + sum(mask[8:12]) + sum(mask[13:16])
    assert count.loop_accepted == expected
    assert count.degenerate


def test_an_eos_may_cut_the_last_step_and_a_short_layout_is_an_error():
    assert loop_count([1, 2, 3], [4]).accepted == 3  # the step accepted 4 but the output ended after 3
    with pytest.raises(ValueError, match="fewer than the 5 generated"):
        loop_count([1, 2, 3, 4, 5], [1])
    with pytest.raises(ValueError, match="n >= 1"):
        loop_mask([1, 2], n=0)
