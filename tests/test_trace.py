"""Traces: one row per step, chips consistent with the run's counters and with the verifier's
rule, and a page that is valid HTML with no external references."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
from drafters_for_tests import RandomQDrafter, RandomTreeDrafter
from tiny import tiny_model

import specdec
from specdec import Sampling, cli
from specdec.teaching.trace import Trace
from specdec.teaching.trace_view import trace_html, trace_lines

PROMPT = [3, 17, 9, 41, 5, 22, 3, 17, 9]


def _run(drafter, sampling: Sampling, eos=None):
    """A traced run verified token-wise: the rule whose tests these checks read (min(1, p/q) per token)."""
    model = tiny_model("llama")
    trace = Trace()
    result = specdec.generate(model, PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=40,
                              sampling=sampling, seed=4, trace=trace, eos_token_id=eos, verify_rule="token")
    return result, trace


def _kinds(trace: Trace, kind: str) -> int:
    return sum(1 for step in trace.steps for token in step.tokens if token.kind == kind)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.9, top_p=0.9)])
@pytest.mark.parametrize("make", [lambda: specdec.make_drafter("ngram"), lambda: RandomQDrafter(64)])
def test_one_row_per_step_and_chips_match_the_counters(make, sampling: Sampling):
    result, trace = _run(make(), sampling)
    stats = result.stats
    assert trace.prompt == PROMPT and len(trace.steps) == stats.steps
    assert [t for step in trace.steps for t in step.emitted] == result.tokens
    assert _kinds(trace, "accepted") == stats.accepted
    assert _kinds(trace, "correction") + _kinds(trace, "bonus") == stats.steps
    drafted_shown = _kinds(trace, "accepted") + _kinds(trace, "rejected")
    assert drafted_shown <= stats.drafted  # drafts after a rejection are never reached
    for step in trace.steps:
        kinds = [t.kind for t in step.tokens]
        assert kinds[-1] in ("correction", "bonus") and kinds.count("rejected") <= 1
        assert ("rejected" in kinds) == (kinds[-1] == "correction")  # a correction only follows a rejection
        for token in step.tokens[:-1]:
            assert 0 <= token.p <= 1 and 0 < token.q <= 1
            if sampling.greedy:
                assert token.uniform is None and token.accept == (1.0 if token.kind == "accepted" else 0.0)
            else:  # the verifier's rule: accept iff u < min(1, p/q)
                assert token.accept == pytest.approx(min(1.0, token.p / token.q), rel=1e-4, abs=1e-6)
                assert (token.uniform < token.accept) == (token.kind == "accepted")
        assert step.draft_seconds >= 0 and step.verify_seconds > 0


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.9, top_p=0.9)])
@pytest.mark.parametrize("sampled", [False, True])
def test_tree_steps_list_each_tried_sibling_then_the_accepted_one(sampling: Sampling, sampled: bool):
    result, trace = _run(RandomTreeDrafter(seed=5, sampled=sampled), sampling)
    stats = result.stats
    assert len(trace.steps) == stats.steps
    assert [t for step in trace.steps for t in step.emitted] == result.tokens
    assert _kinds(trace, "accepted") == stats.accepted
    assert _kinds(trace, "correction") + _kinds(trace, "bonus") == stats.steps
    assert _kinds(trace, "accepted") + _kinds(trace, "rejected") <= stats.drafted
    assert any([t.kind for t in step.tokens].count("rejected") > 1 for step in trace.steps)  # siblings tried
    for step in trace.steps:
        for token in step.tokens[:-1]:
            assert 0 <= token.p <= 1 and 0 < token.q <= 1 and token.accept is not None
            if sampling.greedy:
                assert token.uniform is None and token.accept == (1.0 if token.kind == "accepted" else 0.0)
            else:  # accept iff u < min(1, p'/q), p' the residual after the siblings tried before it
                assert (token.uniform < token.accept) == (token.kind == "accepted")


def test_tokens_past_eos_are_not_in_the_trace():
    plain = specdec.generate(tiny_model("llama"), PROMPT, max_new_tokens=40).tokens
    eos = plain[5]
    result, trace = _run(specdec.make_drafter("ngram"), Sampling(), eos=eos)
    assert result.tokens[-1] == eos and [t for s in trace.steps for t in s.emitted] == result.tokens


class _Checker(HTMLParser):
    VOID = {"meta", "br", "link", "img", "input", "hr"}

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.external: list[str] = []
        self.steps = self.chips = 0

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.open.append(tag)
        values = dict(attrs)
        self.external += [v for k, v in attrs if k in ("src", "href") and v]
        classes = (values.get("class") or "").split()
        self.steps += "step" in classes
        self.chips += "tok" in classes and bool({"accepted", "rejected", "correction", "bonus"} & set(classes))

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (tag, self.open)
        self.open.pop()


def test_the_page_is_valid_self_contained_html_with_a_row_per_step():
    result, trace = _run(specdec.make_drafter("ngram"), Sampling(temperature=0.8))
    page = trace_html(trace, lambda ids: "".join(chr(65 + i % 26) for i in ids), 0.001)
    checker = _Checker()
    checker.feed(page)
    assert checker.open == [] and checker.external == [] and "http" not in page
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page
    assert checker.steps == result.stats.steps
    assert checker.chips == 4 + sum(len(s.tokens) for s in trace.steps)  # 4 legend chips
    assert len(trace_lines(trace, lambda ids: "x", colour=False)) == result.stats.steps


def test_generate_and_trace_commands_write_pages(quick_zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    page = tmp_path / "generate.html"
    assert cli.main(["generate", "--target", str(quick_zoo / "target"), "--drafter", "ngram", "--max-new-tokens",
                     "12", "--trace", str(page), "--show-steps", "def add(a, b):\n"]) == 0
    out = capsys.readouterr().out
    assert page.is_file() and "stats: steps=" in out and "(draft " in out
    traced = tmp_path / "trace.html"
    assert cli.main(["trace", "--quick", "--cache-dir", str(quick_zoo.parent), "--max-new-tokens", "12",
                     "--out", str(traced), "--quiet"]) == 0
    text = traced.read_text()
    assert "specdec trace: eagle, k = 4" in text and 'class="step"' in text


@pytest.mark.parametrize("tree", [False, True])
def test_trace_records_the_draft_and_the_caches_rolling_back(tree: bool) -> None:
    """Each step keeps its whole draft (a tree with its parents), and the target's cache goes from
    the committed length, to that plus the verify rows, back to the committed length after it."""
    model = tiny_model("llama")
    drafter = RandomTreeDrafter() if tree else RandomQDrafter()
    trace = Trace()
    result = specdec.generate(model, PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=30,
                              sampling=Sampling(temperature=0.9), seed=2, trace=trace)
    committed = len(PROMPT) - 1  # the cache holds all but the last committed id
    for step in trace.steps:
        assert step.caches is not None
        before, verified, after = step.caches.target
        assert before == committed
        assert verified == before + len(step.drafted) + 1
        committed += len(step.emitted)
        assert after == committed
        assert (step.parents is not None) == (tree and bool(step.drafted))  # the last step may draft nothing
        if step.parents is not None:
            assert len(step.parents) == len(step.drafted) and all(-1 <= p < i for i, p in enumerate(step.parents))
        for token in step.tokens:
            if token.kind in ("accepted", "rejected"):
                assert token.node is not None and step.drafted[token.node] == token.token
            else:
                assert token.node is None
    assert [t for s in trace.steps for t in s.emitted] == result.tokens


def test_trace_records_the_draft_models_cache() -> None:
    """A drafter that reports `cache_length` (the draft model) has its cache traced: it grows
    while drafting and is rolled back to the committed tokens by the commit."""
    target = tiny_model("llama")
    trace = Trace()
    drafter = specdec.make_drafter("draft-model", model=tiny_model("llama", seed=5))
    specdec.generate(target, PROMPT, drafter=drafter, num_draft_tokens=3, max_new_tokens=20, trace=trace)
    committed = len(PROMPT) - 1
    for step in trace.steps:
        assert step.caches is not None and step.caches.drafter is not None
        before, drafted, after = step.caches.drafter
        if step.drafted:
            assert drafted > before
        committed += len(step.emitted)
        assert after <= committed
    plain = Trace()
    specdec.generate(target, PROMPT, drafter="ngram", num_draft_tokens=3, max_new_tokens=8, trace=plain)
    assert all(s.caches is not None and s.caches.drafter is None for s in plain.steps)
