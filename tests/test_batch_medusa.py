"""Medusa in a batch (`specdec.generate_batch`): the drafter has one form, which drafts every live row
with one pass of the heads per step, under every setting (chains and trees, greedy and sampled,
sampling that reads the prefix), and each row decodes exactly as it does alone (the same tokens,
the same drafts accepted, the same random draws)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_medusa import HIDDEN, PROMPT, VOCAB, checkpoint, fitted_heads
from tiny import tiny_model
from transformers import PreTrainedModel

import specdec
from specdec import Sampling
from specdec.drafters.feature_heads import medusa
from specdec.runtime.engine import Step, compile_failures

NEW = 20
PROMPTS = [PROMPT, [7], PROMPT[:4], PROMPT[3:] + [40, 2]]  # ragged, one of a single id (no hidden row at first)
CHOICES = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


@functools.lru_cache(maxsize=None)
def _target() -> PreTrainedModel:
    return tiny_model("llama", vocab_size=VOCAB, hidden=HIDDEN, seed=0)  # float64: drafts have no near-ties


@pytest.fixture(scope="module")
def heads_path(tmp_path_factory) -> Path:
    """Heads fitted to the target's greedy run on PROMPT, so that rows accept many drafts."""
    return checkpoint(tmp_path_factory.mktemp("medusa"), fitted_heads(_target(), PROMPT, num_heads=3))


@pytest.fixture
def head_calls(monkeypatch) -> list[tuple[bool, int]]:
    """(compiled, rows) of every call of the heads' Step, batch-1 and batched alike."""
    calls: list[tuple[bool, int]] = []

    class RecordingStep(Step):
        def __call__(self, *args: Any) -> Any:
            calls.append((self.compiled, args[0].shape[0]))
            return super().__call__(*args)

    monkeypatch.setattr(medusa, "Step", RecordingStep)
    return calls


def _eos() -> int:
    """A token row 0 emits early in plain greedy decoding, so that row ends first."""
    return specdec.generate(_target(), PROMPT, max_new_tokens=NEW).tokens[4]


def _alone(make: Callable[[], object], **options: Any) -> list[specdec.Generation]:
    """Each prompt decoded alone with a fresh drafter; a seed s is row i's s + i, as in a batch."""
    seed = options.pop("seed", None)
    return [specdec.generate(_target(), prompt, drafter=make(), max_new_tokens=NEW,
                             seed=None if seed is None else seed + i, **options) for i, prompt in enumerate(PROMPTS)]


def _same_rows(batch: specdec.BatchGenerations, alone: list[specdec.Generation]) -> None:
    """Each row's tokens, and its drafts' counts, are its batch-1 decoding's."""
    assert [row.tokens for row in batch] == [one.tokens for one in alone]
    for i, (row, one) in enumerate(zip(batch, alone)):
        assert (row.stats.drafted, row.stats.accepted, row.stats.steps) == \
            (one.stats.drafted, one.stats.accepted, one.stats.steps), f"row {i}: {row.stats} vs alone {one.stats}"


@pytest.mark.parametrize("options", [{}, {"tree": True}, {"medusa_choices": CHOICES, "sample": True}],
                         ids=["chain", "default-tree", "choices-tree"])
def test_greedy_rows_decode_as_alone_with_one_pass_of_the_heads_per_step(heads_path, head_calls, options):
    make = functools.partial(specdec.make_drafter, "medusa", path=str(heads_path), **options)
    eos = _eos()
    batch = specdec.generate_batch(_target(), PROMPTS, drafter=make(), max_new_tokens=NEW, eos_token_id=eos)
    batched_calls = list(head_calls)
    alone = _alone(make, eos_token_id=eos)
    _same_rows(batch, alone)
    assert batch[0].tokens[-1] == eos and len(batch[0].tokens) < NEW, "row 0 should end early at its EOS"
    assert sum(row.stats.accepted for row in batch) > len(PROMPTS), "vacuous: the fitted heads were never accepted"
    proposes = len(head_calls) - len(batched_calls)  # alone (and row by row): one pass per row and step
    assert len(batched_calls) <= batch.totals.steps and len(batched_calls) < proposes
    assert max(rows for _, rows in batched_calls) == len(PROMPTS), "every row's hidden row in one pass"
    assert batched_calls[0][1] == len(PROMPTS) - 1, "the 1-id prompt has no hidden row at the first step"


def test_sampled_chain_rows_draw_what_they_draw_alone(heads_path, head_calls):
    make = functools.partial(specdec.make_drafter, "medusa", path=str(heads_path), sample=True)
    for sampling in (Sampling(temperature=1.0), Sampling(temperature=0.7, top_k=4, top_p=0.9)):
        for seed in (0, 11):
            head_calls.clear()
            batch = specdec.generate_batch(_target(), PROMPTS, drafter=make(), max_new_tokens=NEW,
                                           sampling=sampling, seed=seed)
            assert max(rows for _, rows in head_calls) == len(PROMPTS)
            # each row's draws come from its own generator (seeded seed + row), in batch-1's order
            _same_rows(batch, _alone(make, sampling=sampling, seed=seed))
    rows = specdec.generate_batch(_target(), [PROMPTS[1]] * 4, drafter=make(), max_new_tokens=NEW,
                                  sampling=Sampling(temperature=1.0), seed=3)
    assert len({tuple(row.tokens) for row in rows}) > 1, "rows of one prompt should draw apart"


@pytest.mark.parametrize(("options", "sampling"), [
    ({"tree": True, "sample": True}, Sampling(temperature=1.0)),
    ({"sample": True}, Sampling(temperature=1.0, repetition_penalty=1.2)),
    ({"sample": True}, Sampling(temperature=0.8, no_repeat_ngram_size=2)),
], ids=["sampled-tree", "repetition-penalty", "no-repeat-ngram"])
def test_sampled_trees_and_prefix_reading_sampling_take_one_pass_too(heads_path, head_calls, options, sampling):
    make = functools.partial(specdec.make_drafter, "medusa", path=str(heads_path), **options)
    batch = specdec.generate_batch(_target(), PROMPTS, drafter=make(), max_new_tokens=NEW, sampling=sampling, seed=5)
    assert head_calls and max(rows for _, rows in head_calls) == len(PROMPTS), "every row's hidden row in one pass"
    assert len(head_calls) <= batch.totals.steps
    assert all(len(row.tokens) == NEW for row in batch)
    assert sum(row.stats.drafted for row in batch) > 0
    _same_rows(batch, _alone(make, sampling=sampling, seed=5))


@pytest.mark.usefixtures("strict_compile")
def test_a_compiled_batch_equals_the_eager_one_on_padded_shapes(heads_path, head_calls):
    make = functools.partial(specdec.make_drafter, "medusa", path=str(heads_path))
    prompts = PROMPTS + [PROMPT[2:]]  # five rows, padded to 8 while all decode
    eos = specdec.generate(_target(), prompts[2], max_new_tokens=NEW).tokens[3]
    eager = specdec.generate_batch(_target(), prompts, drafter=make(), max_new_tokens=NEW, eos_token_id=eos)
    assert {compiled for compiled, _ in head_calls} == {False}
    head_calls.clear()
    failed = compile_failures()  # those of earlier tests in this process
    compiled = specdec.generate_batch(_target(), prompts, drafter=make(), max_new_tokens=NEW, eos_token_id=eos,
                                      compile=True)
    assert compile_failures() == failed, compile_failures()
    assert all(compiled for compiled, _ in head_calls), head_calls
    assert [row.tokens for row in compiled] == [row.tokens for row in eager]
    assert [(row.stats.drafted, row.stats.accepted) for row in compiled] == \
        [(row.stats.drafted, row.stats.accepted) for row in eager]
    shapes = {rows for _, rows in head_calls}
    assert shapes <= {1, 2, 4, 8} and 8 in shapes, f"heads' batch shapes {sorted(shapes)}"
