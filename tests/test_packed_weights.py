"""Packed weights on the CPU engine (`specdec.runtime.packed`, docs/engine.md *Packed weights*): a
step whose weights are frozen into its graph and multiplied by inductor's C++ GEMM template. The
tests force packing on tiny models (`PACKED_ENV`) and check that the template ran, that the tokens
are those of eager decoding, and that a packed graph serves only the modules it was compiled with."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny import tiny_model

import specdec
from specdec.runtime import engine
from specdec.runtime import packed as packing

pytestmark = pytest.mark.usefixtures("strict_compile")


def _templates() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cpp_templated_kernel_counter"])


PROMPT = [5, 9, 2, 7]


@pytest.fixture
def packed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(packing.PACKED_ENV, "1")


@pytest.fixture(scope="module")
def model():
    """A tiny float32 Llama, compiled packed by the first test (its graphs reused by the second)."""
    return tiny_model("llama", dtype=torch.float32, seed=3, layers=1, max_positions=1024)


def test_a_packed_generation_runs_the_gemm_template_and_decodes_as_eager_decoding(packed, model):
    prompt = PROMPT
    eager = specdec.generate(model, prompt, max_new_tokens=12).tokens
    before = _templates()
    compiled = specdec.generate(model, prompt, max_new_tokens=12, compile=True).tokens
    assert _templates() > before, "no matrix product went through inductor's C++ GEMM template"
    assert compiled == eager
    spec = specdec.generate(model, prompt, max_new_tokens=12, compile=True, drafter=specdec.make_drafter("ngram"),
                            num_draft_tokens=3).tokens
    assert spec == eager


def test_a_packed_graph_reads_the_cache_it_is_given_not_the_one_it_compiled_with(packed, model):
    """A static cache's tensors are marked as fixed addresses by transformers, which freezing took
    for constants: after a longer prompt's larger cache, a new cache of the first size made the
    first graph decode from the old cache's tensors (other tokens, then positions past its end)."""
    long = [(i * 7) % 13 + 1 for i in range(300)]  # a cache of 512 positions between two of 256
    other = [(i * 5) % 31 + 20 for i in range(40)]
    prompts = (PROMPT, long, other)
    expected = [specdec.generate(model, p, max_new_tokens=24).tokens for p in prompts]
    assert [specdec.generate(model, p, max_new_tokens=24, compile=True).tokens for p in prompts] == expected


def test_a_packed_graph_serves_only_the_modules_it_was_compiled_with_and_no_copy(packed, model):
    other = tiny_model("llama", dtype=torch.float32, seed=4, layers=1)  # the same structure, other weights
    expected = [specdec.generate(m, PROMPT, max_new_tokens=1).tokens for m in (model, other)]
    assert expected[0] != expected[1]  # the two models differ, so a shared graph would show
    got = [specdec.generate(m, PROMPT, max_new_tokens=1, compile=True).tokens for m in (model, other)]
    assert got == expected
    for m in (model, other):
        held = vars(m)[packing.PACKED_ATTRIBUTE]
        assert held and all(isinstance(step, packing._Packed) for step in held.values())
    assert not vars(copy.deepcopy(model))[packing.PACKED_ATTRIBUTE]  # a copy starts without the graphs


def test_packing_is_decided_by_size_unless_the_environment_says(monkeypatch: pytest.MonkeyPatch):
    small = torch.nn.Linear(8, 8)
    big = torch.nn.Linear(4096, 4096 + packing.PACKED_MIN_BYTES // (4 * 4096))  # just past the threshold in float32
    cpu = torch.device("cpu")
    monkeypatch.delenv(packing.PACKED_ENV, raising=False)
    assert not packing.packs_weights(cpu, (small,)) and packing.packs_weights(cpu, (big,))
    assert not packing.packs_weights(torch.device("meta"), (big,))
    # a step packs by its owner's weights: a small head running a big LM head stays unpacked (shared graphs)
    assert engine.Step(lambda owner, x: x, "a probe", True, big).packed
    assert not engine.Step(lambda owner, head, x: head(x), "a probe", True, small, uses=(big,)).packed
    monkeypatch.setenv(packing.PACKED_ENV, "0")
    assert not packing.packs_weights(cpu, (big,))
    monkeypatch.setenv(packing.PACKED_ENV, "1")
    assert packing.packs_weights(cpu, (small,))
    monkeypatch.setenv(packing.PACKED_ENV, "yes")
    with pytest.raises(ValueError, match=r"SPECDEC_PACKED_WEIGHTS='yes'.*1.*0.*unset"):
        packing.packs_weights(cpu, (small,))

