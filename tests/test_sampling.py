"""The sampling pipeline: Sampling validation, and probabilities() equal to transformers' warpers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specdec.sampling import probabilities, sample
from specdec.types import Sampling
from strategies import logits, samplings, vocab_sizes

BAD_SETTINGS = [
    ("temperature", dict(temperature=-0.5)),
    ("temperature", dict(temperature=-1e-12)),
    ("temperature", dict(temperature=math.nan)),
    ("temperature", dict(temperature=math.inf)),
    ("temperature", dict(temperature=-math.inf)),
    ("temperature", dict(temperature="0.7")),
    ("top_k", dict(top_k=-1)),
    ("top_k", dict(top_k=2.0)),
    ("top_k", dict(top_k=2.5)),
    ("top_k", dict(top_k="5")),
    ("top_k", dict(top_k=True)),
    ("top_p", dict(top_p=0.0)),
    ("top_p", dict(top_p=-0.3)),
    ("top_p", dict(top_p=1.0000001)),
    ("top_p", dict(top_p=2.0)),
    ("top_p", dict(top_p=math.nan)),
]


@pytest.mark.parametrize(("field", "kwargs"), BAD_SETTINGS, ids=[f"{f}={v}" for f, kw in BAD_SETTINGS
                                                                 for v in kw.values()])
def test_invalid_sampling_raises_value_error_naming_the_field(field: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=field):
        Sampling(**kwargs)


@given(samplings())
def test_valid_sampling_constructs_and_reports_greedy_iff_temperature_zero(sampling: Sampling) -> None:
    assert sampling.greedy == (sampling.temperature == 0.0)


def transformers_probabilities(scores: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """transformers' warpers in generate()'s order, then softmax; scores [n, V]."""
    input_ids = torch.zeros(scores.shape[0], 1, dtype=torch.long)
    scores = TemperatureLogitsWarper(sampling.temperature)(input_ids, scores)
    if sampling.top_k > 0:
        scores = TopKLogitsWarper(top_k=sampling.top_k)(input_ids, scores)
    if sampling.top_p < 1.0:
        scores = TopPLogitsWarper(top_p=sampling.top_p)(input_ids, scores)
    return scores.softmax(dim=-1)


@settings(max_examples=150)
@given(st.data())
def test_probabilities_equal_transformers_warpers(data: st.DataObject) -> None:
    vocab_size = data.draw(vocab_sizes())
    rows = data.draw(st.integers(1, 3))
    scores = data.draw(logits(vocab_size, rows))  # (n, V)
    sampling = data.draw(samplings(greedy=False))
    ours = probabilities(scores, sampling)
    theirs = transformers_probabilities(scores.clone(), sampling)
    assert ours.dtype == torch.float64
    assert torch.equal(ours > 0, theirs > 0), f"supports differ for {sampling}:\n{ours}\n{theirs}"
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-9, msg=lambda m: f"{sampling}: {m}")


@pytest.mark.parametrize("top_p", [0.25, 0.5, 0.75])
def test_top_p_boundary_matches_transformers_on_tied_logits(top_p: float) -> None:
    scores = torch.zeros(1, 4, dtype=torch.float64)  # cumulative mass 0.25, 0.5, 0.75, 1 exactly
    sampling = Sampling(temperature=1.0, top_p=top_p)
    ours = probabilities(scores, sampling)
    theirs = transformers_probabilities(scores.clone(), sampling)
    assert torch.equal(ours > 0, theirs > 0), f"{sampling}: {ours} vs transformers {theirs}"
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-9)


@given(st.data())
def test_greedy_probabilities_are_one_hot_at_argmax(data: st.DataObject) -> None:
    vocab_size = data.draw(vocab_sizes())
    scores = data.draw(logits(vocab_size, rows=data.draw(st.integers(1, 3))))  # (n, V)
    sampling = data.draw(samplings(greedy=True))
    probs = probabilities(scores, sampling)
    expected = torch.nn.functional.one_hot(scores.argmax(-1), vocab_size).to(probs.dtype)
    assert torch.equal(probs, expected)


@given(st.data())
def test_probability_rows_are_distributions_keeping_a_most_likely_token(data: st.DataObject) -> None:
    vocab_size = data.draw(vocab_sizes())
    scores = data.draw(logits(vocab_size, rows=data.draw(st.integers(1, 3))))  # (n, V)
    sampling = data.draw(samplings())
    probs = probabilities(scores, sampling)
    assert probs.shape == scores.shape
    assert bool((probs >= 0).all()) and bool(torch.isfinite(probs).all())
    torch.testing.assert_close(probs.sum(-1), torch.ones(scores.shape[0], dtype=torch.float64),
                               rtol=0, atol=1e-12)
    most_likely = scores == scores.max(-1, keepdim=True).values  # (n, V), ties included
    kept = ((probs > 0) & most_likely).any(-1)  # (n,)
    assert bool(kept.all()), f"{sampling} dropped every most likely token: {probs}"


@given(st.data())
def test_top_k_keeps_at_most_k_tokens_unless_tied(data: st.DataObject) -> None:
    vocab_size = data.draw(vocab_sizes())
    scores = data.draw(logits(vocab_size))  # (V,)
    top_k = data.draw(st.integers(1, vocab_size))
    probs = probabilities(scores, Sampling(temperature=1.0, top_k=top_k))
    kth = scores.topk(top_k).values[-1]
    assert torch.equal(probs > 0, scores >= kth)


@given(st.data())
def test_sample_greedy_returns_argmax_and_no_probs(data: st.DataObject) -> None:
    vocab_size = data.draw(vocab_sizes())
    scores = data.draw(logits(vocab_size, rows=data.draw(st.integers(1, 3))))  # (n, V)
    tokens, probs = sample(scores, data.draw(samplings(greedy=True)), None)
    assert probs is None
    assert torch.equal(tokens, scores.argmax(-1))


@given(st.data())
def test_sample_draws_from_the_support_and_returns_the_pipeline_probs(data: st.DataObject) -> None:
    vocab_size = data.draw(vocab_sizes())
    scores = data.draw(logits(vocab_size, rows=data.draw(st.integers(1, 3))))  # (n, V)
    sampling = data.draw(samplings(greedy=False))
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    tokens, probs = sample(scores, sampling, generator)
    assert probs is not None and torch.equal(probs, probabilities(scores, sampling))
    assert tokens.shape == (scores.shape[0],) and tokens.dtype == torch.long
    assert bool((probs.gather(-1, tokens.unsqueeze(-1)) > 0).all())
