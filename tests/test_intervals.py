"""The bootstrap intervals over prompts and the ranks they support (`specdec.intervals`)."""

from __future__ import annotations

import random

import pytest

from specdec.intervals import Interval, paired_difference, rank_labels, ranks, ratio_interval


def test_a_ratio_of_sums_and_an_interval_around_it():
    new, steps = [30, 40, 50, 20], [10, 10, 20, 10]
    interval = ratio_interval(new, steps)
    assert interval.estimate == pytest.approx(140 / 50)
    assert interval.low <= interval.estimate <= interval.high
    assert ratio_interval(new, steps) == interval  # seeded: the same counts give the same interval anywhere


def test_identical_prompts_give_no_width():
    interval = ratio_interval([20] * 8, [10] * 8)
    assert (interval.low, interval.estimate, interval.high) == (2.0, 2.0, 2.0)


def test_the_interval_narrows_with_more_prompts_and_covers_the_truth():
    rng = random.Random(1)

    def prompts(n: int) -> tuple[list[int], list[int]]:
        steps = [rng.randint(20, 40) for _ in range(n)]
        return [s * 2 + rng.randint(-15, 15) for s in steps], steps  # mean accepted length about 2

    few, many = ratio_interval(*prompts(10)), ratio_interval(*prompts(400))
    assert many.high - many.low < (few.high - few.low) / 3
    assert many.low < 2.0 < many.high


def test_a_paired_difference_sees_what_unpaired_intervals_cannot():
    rng = random.Random(2)
    steps = [rng.randint(10, 60) for _ in range(30)]
    easy = [rng.uniform(1.0, 4.0) for _ in steps]  # prompts differ a lot; drafter b is always 0.1 behind
    a = ([round(s * e) for s, e in zip(steps, easy)], steps)
    b = ([round(s * (e - 0.1)) for s, e in zip(steps, easy)], steps)
    alone_a, alone_b = ratio_interval(*a), ratio_interval(*b)
    assert alone_a.low < alone_b.high  # the intervals overlap...
    assert paired_difference(a, b).low > 0  # ...yet the paired difference excludes zero
    assert ranks({"a": a, "b": b}) == {"a": 1, "b": 2}


def test_ranks_tie_what_the_intervals_cannot_order():
    rng = random.Random(3)
    steps = [rng.randint(10, 60) for _ in range(12)]
    noisy = [round(s * rng.uniform(1.5, 2.5)) for s in steps]
    same = [round(s * rng.uniform(1.5, 2.5)) for s in steps]
    far = [s * 4 for s in steps]
    ranked = ranks({"noisy": (noisy, steps), "same": (same, steps), "far": (far, steps)})
    assert ranked == {"noisy": 2, "same": 2, "far": 1}
    assert rank_labels(ranked) == {"noisy": "=2", "same": "=2", "far": "1"}


def test_ranks_never_contradict_the_estimates():
    rng = random.Random(4)
    steps = [rng.randint(10, 60) for _ in range(20)]
    counts = {f"d{i}": ([round(s * rng.uniform(1.0, 1.0 + i * 0.3)) for s in steps], steps) for i in range(6)}
    ranked = ranks(counts)
    estimates = {name: sum(n) / sum(d) for name, (n, d) in counts.items()}
    for a in ranked:
        for b in ranked:
            if ranked[a] < ranked[b]:
                assert estimates[a] > estimates[b]
    assert min(ranked.values()) == 1 and max(ranked.values()) > 1


def test_bad_counts_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="3 numerators against 2 denominators"):
        ratio_interval([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="positive sum"):
        ratio_interval([1, 2], [0, 0])
    with pytest.raises(ValueError, match="same prompts"):
        paired_difference(([1, 2], [1, 1]), ([1], [1]))
    with pytest.raises(ValueError, match="at least one prompt"):
        ratio_interval([], [])


def test_formatting():
    interval = Interval(2.984, 2.71, 3.249)
    assert interval.format() == "2.98 [2.71, 3.25]"
    assert interval.format(suffix="x") == "2.98x [2.71x, 3.25x]"
    assert interval.excludes(3.3) and not interval.excludes(3.0)
