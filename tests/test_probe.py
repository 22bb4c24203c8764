"""The verify probe: one forward, the greedy verifier's verdict per continuation token."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from tiny import ARCHITECTURES, hf_greedy, tiny_model

import specdec
from specdec import cli
from specdec.teaching.probe import probe

PREFIX = [3, 17, 9, 41, 5, 22]


class ForwardCounter:
    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        model.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_greedy_continuation_is_accepted_whole_in_one_forward(arch: str):
    model = tiny_model(arch)
    expected = hf_greedy(model, PREFIX, 7)  # 6 to check, the 7th is the bonus
    counter = ForwardCounter(model)
    result = probe(model, PREFIX, expected[:6])
    assert counter.calls == 1
    assert result.bonus and result.num_accepted == 6 and result.correction == expected[6]
    assert all(p.verdict == "accepted" and p.rank == 1 for p in result.positions)
    assert all(p.top[0][0] == p.token and abs(p.top[0][1] - p.probability) < 1e-12 for p in result.positions)


@pytest.mark.parametrize("wrong_at", [0, 2, 5])
def test_the_first_mismatch_is_rejected_with_the_verifiers_correction(wrong_at: int):
    model = tiny_model("qwen3")
    expected = hf_greedy(model, PREFIX, 6)
    continuation = list(expected)
    continuation[wrong_at] = (expected[wrong_at] + 1) % 64
    result = probe(model, PREFIX, continuation)
    assert result.num_accepted == wrong_at and not result.bonus
    assert result.correction == expected[wrong_at]  # what the verifier emits instead
    assert [p.verdict for p in result.positions] == (["accepted"] * wrong_at + ["rejected"]
                                                      + ["not reached"] * (5 - wrong_at))
    assert result.positions[wrong_at].rank > 1
    # the loop agrees: decoding with a drafter that proposes this continuation accepts the same count
    class Fixed:
        name = "fixed"

        def propose(self, ctx, k):
            return specdec.Draft(torch.tensor(continuation[:k]))

    # one drafted step of wrong_at + 1 tokens, then one plain token (a budget of 1 drafts nothing)
    run = specdec.generate(model, PREFIX, drafter=Fixed(), num_draft_tokens=wrong_at + 1, max_new_tokens=wrong_at + 2)
    assert run.stats.drafted == wrong_at + 1 and run.stats.accepted == wrong_at
    assert run.tokens[: wrong_at + 1] == expected[: wrong_at + 1]


def test_empty_inputs_are_refused():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="prefix"):
        probe(model, [], [1])
    with pytest.raises(ValueError, match="continuation"):
        probe(model, [1], [])


class _Checker(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in ("meta", "br", "link", "img"):
            self.open.append(tag)
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.external.append(value)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (tag, self.open)
        self.open.pop()


def test_the_command_prints_a_table_and_writes_a_self_contained_page(quick_zoo: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]):
    page = tmp_path / "probe.html"
    assert cli.main(["verify", "--target", str(quick_zoo / "target"), "def add(a, b):\n",
                     "    return a + b\n", "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "greedy verifier" in out and ("accepted, then the correction" in out or "bonus token" in out)
    checker = _Checker()
    checker.feed(page.read_text())
    assert checker.open == [] and checker.external == []
    assert cli.main(["verify", "--target", str(quick_zoo / "target"), "", "x"]) == 2
    assert "prefix" in capsys.readouterr().err
