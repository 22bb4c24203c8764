"""`num_draft_tokens="auto"` (`specdec.decoding.auto_draft`): the loop drafts only when the tokens
a drafting step is expected to emit per second beat a plain step's, from the step times it
measures and each row's running acceptance. Step costs are set here by a clock the test
advances (each drafted token costs the drafter time), so every decision is deterministic; the
tokens are plain decoding's whatever the decisions, in one row and in batches, eager and
compiled; the decisions are in the trace."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_model

import specdec
from specdec.decoding.auto_draft import (PROBE_FIRST, AutoDraft, acceptance, drafting_pays, expected_accepted)
from specdec.protocols import DraftContext
from specdec.teaching.trace import Trace
from specdec.types import Draft

PROMPT = [3, 9, 4, 3, 9, 4, 3, 9, 11, 2]
NEW = 40


class Clock:
    """Seconds that move only when told: each reading adds half a plain step's cost (a step reads
    it at its start and its end)."""

    def __init__(self, step: float = 0.010) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step / 2
        return self.now


class Costly:
    """A drafter of the target's own greedy continuation (every token kept: `right=True`) or of
    wrong ids, each drafted token costing `per_token` on the clock."""

    name = "costly"

    def __init__(self, model: torch.nn.Module, clock: Clock, per_token: float, right: bool) -> None:
        self.model, self.clock, self.per_token, self.right = model, clock, per_token, right

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self.clock.now += self.per_token * k
        if not self.right:
            return Draft((ctx.tokens[-1:].repeat(k) + 1) % ctx.vocab_size)
        ids = ctx.tokens.clone()
        for _ in range(k):
            ids = torch.cat([ids, self.model(input_ids=ids[None]).logits[0, -1].argmax()[None]])
        return Draft(ids[ctx.tokens.shape[0] :])


def _timed(model: torch.nn.Module, kind: type[Costly], per_token: float, right: bool, **options: int) -> AutoDraft:
    """`kind` drafting under `auto`, timed by a clock of its own (`Clock`)."""
    clock = Clock()
    return AutoDraft(kind(model, clock, per_token=per_token, right=right), clock=clock, **options)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", dtype=torch.float32, vocab_size=48, seed=2, layers=1)


def test_the_expected_gain_follows_the_acceptance_model():
    assert expected_accepted(0.5, 3) == pytest.approx(0.875)
    assert expected_accepted(1.0, 4) == 4 and expected_accepted(0.9, 0) == 0
    assert acceptance(0, 0) == 0.5 and acceptance(8, 0) == pytest.approx(0.9)
    # one row at alpha 0.5 drafting 3: 1.875 tokens; drafting pays while its step costs under 1.875 plain steps
    assert drafting_pays([0.5], [3], spec_seconds=1.8, plain_seconds=1.0)
    assert not drafting_pays([0.5], [3], spec_seconds=1.9, plain_seconds=1.0)
    assert drafting_pays([0.9, 0.1], [4, 4], spec_seconds=1.5, plain_seconds=1.0)  # a batch: the rows' sum


def test_a_drafter_that_costs_more_than_it_saves_is_turned_off_and_probed_again(model):
    plain = specdec.generate(model, PROMPT, max_new_tokens=NEW).tokens
    drafter = _timed(model, Costly, per_token=0.010, right=False)
    trace = Trace()
    result = specdec.generate(model, PROMPT, drafter=drafter, max_new_tokens=NEW, trace=trace)
    assert result.tokens == plain
    drafted = [d for d, _ in drafter.decisions]
    assert drafted[:2] == [True, True] and drafted[2] is False  # two drafting steps, then a plain one, measured
    assert drafted.count(True) < len(drafted) // 3, drafted  # then off, but for probes
    off = next(i for i in range(3, len(drafted)) if not drafted[i])
    assert drafted[off : off + PROBE_FIRST] == [False] * PROBE_FIRST and True in drafted[off + PROBE_FIRST :]
    notes = [step.note for step in trace.steps][:-1]  # the last step, one token of budget left, asks no drafter
    assert all(notes) and any(n.startswith("plain step") for n in notes) and any(n.startswith("probing") for n in notes)


def test_a_drafter_that_pays_keeps_drafting(model):
    plain = specdec.generate(model, PROMPT, max_new_tokens=NEW).tokens
    drafter = _timed(model, Costly, per_token=0.001, right=True)
    result = specdec.generate(model, PROMPT, drafter=drafter, max_new_tokens=NEW)
    assert result.tokens == plain
    drafted = [d for d, _ in drafter.decisions]
    assert drafted.count(False) == 1, drafted  # the one plain step that measures its cost
    assert result.stats.mean_accepted_length > 3


class FirstRight(Costly):
    """Drafts the target's next greedy token, then wrong ids: a one-token draft is always kept, a
    longer one keeps its first token only."""

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self.clock.now += self.per_token * k
        first = self.model(input_ids=ctx.tokens[None]).logits[0, -1].argmax()[None]
        return Draft(torch.cat([first, (first.repeat(k - 1) + 1) % ctx.vocab_size]))


def test_auto_drafts_one_token_when_one_pays_and_more_do_not(model):
    plain = specdec.generate(model, PROMPT, max_new_tokens=NEW).tokens
    drafter = _timed(model, FirstRight, per_token=0.002, right=True)
    result = specdec.generate(model, PROMPT, drafter=drafter, max_new_tokens=NEW)
    assert result.tokens == plain
    whys = [why for _, why in drafter.decisions]
    chosen = whys[5:]  # after measuring two long drafting steps, a plain one and two of one token
    assert whys[3].startswith("measuring a drafting step of one token")
    # a plain step costs 5 ms, a drafted token 2 more: one token, 1.4 plain steps for up to 2 tokens; four, 2.6
    assert sum(why.startswith("drafting one token") for why in chosen) > len(chosen) // 2, whys
    assert result.stats.mean_accepted_length > 1.5


def test_a_schedule_of_one_token_drafts_is_measured_and_turned_off(model):
    drafter = _timed(model, Costly, per_token=0.010, right=False, start=1)
    specdec.generate(model, PROMPT, drafter=drafter, max_new_tokens=NEW)
    drafted = [d for d, _ in drafter.decisions]
    # every step asked for is one token, timed as a short step: measured twice, then off but for probes
    assert drafted[:3] == [True, True, False] and drafted.count(True) < len(drafted) // 3, drafter.decisions


def test_a_one_token_draft_runs_the_compiled_two_row_verify(model, strict_compile, monkeypatch):
    plain = specdec.generate(model, PROMPT, max_new_tokens=16).tokens
    lm = specdec.CausalLM(model)
    widths: list[int] = []
    forward = specdec.CausalLM.forward

    def spy(self, input_ids, keep, hidden=(), rows=None, prompt=False):
        widths.append(rows)
        return forward(self, input_ids, keep, hidden, rows, prompt)

    monkeypatch.setattr(specdec.CausalLM, "forward", spy)
    result = specdec.generate(lm, PROMPT, drafter=AutoDraft(specdec.make_drafter("ngram")), max_new_tokens=16,
                              compile=True)
    assert lm.compiled and result.tokens == plain
    assert {2, 5} <= set(widths) <= {None, 1, 2, 5}, widths  # the prefill (None), plain, one token, four


@pytest.mark.parametrize("pays", [False, True], ids=["costly", "paying"])
def test_an_auto_drafter_starts_the_next_generation_from_what_it_measured(model, pays):
    plain = specdec.generate(model, PROMPT, max_new_tokens=NEW).tokens
    # a draft of 4 costs 0.4 plain steps: it pays at the first guess of acceptance (0.5), not once measured
    drafter = _timed(model, Costly, per_token=0.001, right=pays)
    specdec.generate(model, PROMPT, drafter=drafter, max_new_tokens=NEW)
    first = [d for d, _ in drafter.decisions]
    assert specdec.generate(model, PROMPT, drafter=drafter, max_new_tokens=NEW).tokens == plain
    second = [d for d, _ in drafter.decisions]
    assert not any(why.startswith("measuring") for _, why in drafter.decisions)  # the step times carried over
    if pays:
        assert all(second), second  # drafting from its first step
    else:  # off from its first step (the pooled acceptance), probed at the interval the first generation reached
        assert first[0] is True and second[0] is False and second.count(True) < first.count(True), (first, second)
        assert second[:PROBE_FIRST + 1] == [False] * (PROBE_FIRST + 1)


def test_auto_decodes_as_plain_decoding_in_batches_and_sampled(model):
    prompts = [PROMPT, PROMPT[:5], PROMPT[2:]]
    batch = specdec.generate_batch(model, prompts, drafter="ngram", num_draft_tokens="auto", max_new_tokens=24)
    assert [g.tokens for g in batch] == [specdec.generate(model, p, max_new_tokens=24).tokens for p in prompts]
    draft = tiny_model("llama", dtype=torch.float32, vocab_size=48, seed=5, layers=1)
    trace = Trace()
    sampled = specdec.generate(model, PROMPT, drafter=specdec.make_drafter("draft-model", model=draft),
                               num_draft_tokens="auto", max_new_tokens=24, trace=trace,
                               sampling=specdec.Sampling(temperature=0.8), seed=3)
    assert len(sampled.tokens) == 24 and all(step.note for step in trace.steps[:-1])
    with pytest.raises(ValueError, match=r"num_draft_tokens must be an int >= 0 or \"auto\", got 'four'"):
        specdec.generate(model, PROMPT, drafter="ngram", num_draft_tokens="four")


def test_auto_on_the_compiled_engine_is_plain_decoding(model, strict_compile):
    plain = specdec.generate(model, PROMPT, max_new_tokens=16).tokens
    lm = specdec.CausalLM(model)
    drafter = AutoDraft(specdec.make_drafter("ngram"))
    result = specdec.generate(lm, PROMPT, drafter=drafter, max_new_tokens=16, compile=True)
    assert lm.compiled, "the run did not decode on the compiled engine"
    assert result.tokens == plain and result.stats.drafted > 0
    # both step costs were measured on the compiled graphs (the compiling steps left out), and compared
    assert any(why.startswith(("drafting:", "drafting one token:", "plain step:")) for _, why in drafter.decisions), \
        drafter.decisions
