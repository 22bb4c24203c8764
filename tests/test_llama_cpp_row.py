"""llama.cpp's row in the bench (`specdec.bench.llama_cpp`): which settings leave it out, the row's
place among the contenders, the bench's and bench-real's handling of its file and of absent
bindings, and the row's run through the bench's loop. The bindings take 20 minutes to build, so
the loop here drives a stand-in module with llama.cpp's interface that records what it was asked;
the real row is measured by `make bench-real` (docs/bench.md)."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from specdec.bench import llama_cpp
from specdec.bench.questions import Question
from specdec.bench.runner import Contender, run_bench
from specdec.bench.session import contenders_for
from specdec.cli import main
from specdec.types import Sampling
from tiny import tiny_model


class _Llama:
    """llama.cpp's `Llama` as the row uses it: it loads a file and generates token after token."""

    made: list[dict[str, Any]] = []
    asked: list[dict[str, Any]] = []

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        _Llama.made.append(settings)

    def n_ctx(self) -> int:
        return int(self.settings["n_ctx"])

    def reset(self) -> None:
        pass

    def set_seed(self, seed: int) -> None:
        self.seed = seed

    def generate(self, tokens: list[int], **options: Any) -> Any:
        _Llama.asked.append({"tokens": list(tokens), "seed": self.seed, **options})
        token = tokens[-1]
        while True:  # forever: the row stops after max_new_tokens
            token = (token * 7 + 3) % 50
            yield token


@pytest.fixture
def bindings(monkeypatch) -> type[_Llama]:
    module = types.ModuleType("llama_cpp")
    module.__spec__ = importlib.machinery.ModuleSpec("llama_cpp", None)
    module.Llama = _Llama  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llama_cpp", module)
    monkeypatch.setattr(llama_cpp, "_LOADED", {})
    _Llama.made, _Llama.asked = [], []
    return _Llama


def test_settings_its_sampler_would_apply_otherwise_leave_the_row_out() -> None:
    assert llama_cpp.llama_cpp_missing(Sampling()) == []
    assert llama_cpp.llama_cpp_missing(Sampling(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05)) == []
    assert llama_cpp.llama_cpp_missing(Sampling(temperature=0.7, repetition_penalty=1.1,
                                                bad_words_ids=[[3]])) == ["repetition_penalty", "bad_words_ids"]
    assert llama_cpp.llama_cpp_missing(Sampling(regex="[ab]+")) == ["regex"]
    with pytest.raises(ValueError, match="cannot apply presence_penalty"):
        llama_cpp.llama_cpp_generate("x.gguf", torch.tensor([1]), 4, Sampling(presence_penalty=0.5), 0)


def test_the_row_comes_last_and_names_its_file(tmp_path: Path) -> None:
    rows = contenders_for([("ngram", {})], [4], peers=False, engines=("compiled",), llama_cpp=tmp_path / "m.gguf")
    assert [c.label for c in rows] == ["plain", "ngram", "llama.cpp"]
    assert rows[-1].peer == "llama.cpp" and rows[-1].options == {"file": str(tmp_path / "m.gguf")}
    assert [c.label for c in contenders_for([("ngram", {})], [4], peers=False)] == ["plain", "ngram"]


def test_the_row_decodes_the_prompts_ids_for_exactly_the_budget_through_the_bench_loop(bindings, tmp_path) -> None:
    model = tiny_model("llama", vocab_size=64)
    prompt = [5, 9, 11, 5, 9]
    file = str(tmp_path / "m.gguf")
    contenders = [Contender("plain"), Contender("llama.cpp", peer="llama.cpp", options={"file": file})]
    for sampling, expected in ((Sampling(), {"temp": 0.0, "top_k": 1}),
                               (Sampling(temperature=0.7, top_k=5, top_p=0.9),
                                {"temp": 0.7, "top_k": 5, "top_p": 0.9, "min_p": 0.0})):
        bindings.asked.clear()
        runs, _ = run_bench(model, lambda turns, answers, index: prompt, lambda ids: "",
                            [Question("q", "code", ("a",), number=3)], contenders, sampling, max_new_tokens=6,
                            repeats=2, warmup=1, seed=10)
        mine = [r for r in runs if r.contender == "llama.cpp"]
        assert len(mine) == 2 and all(len(r.tokens) == 6 and r.stats.new_tokens == 6 == r.stats.steps for r in mine)
        assert mine[0].tokens == [(9 * 7 + 3) % 50, *mine[0].tokens[1:]]
        assert len(bindings.asked) == 3  # the warm-up round and two recorded ones
        for asked in bindings.asked:
            assert asked["tokens"] == prompt and asked["seed"] == 13 and asked["repeat_penalty"] == 1.0
            assert {key: asked[key] for key in expected} == expected
    assert len(bindings.made) == 1 and bindings.made[0]["model_path"] == file  # loaded once for every run
    assert bindings.made[0]["n_threads"] == torch.get_num_threads()


def test_the_bench_refuses_a_missing_file_absent_bindings_and_a_batch(monkeypatch, tmp_path: Path, capsys) -> None:
    base = ["bench", "--target", str(tmp_path), "--drafter", "ngram"]
    assert main([*base, "--llama-cpp", str(tmp_path / "none.gguf")]) == 2
    assert "none.gguf: no such file" in capsys.readouterr().err
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(llama_cpp, "llama_cpp_available", lambda: False)
    assert main([*base, "--llama-cpp", str(tmp_path / "m.gguf")]) == 2
    assert "pip install llama-cpp-python" in capsys.readouterr().err
    monkeypatch.setattr(llama_cpp, "llama_cpp_available", lambda: True)
    assert main([*base, "--llama-cpp", str(tmp_path / "m.gguf"), "--batch", "1", "2"]) == 2
    assert "leave it out of --batch" in capsys.readouterr().err


def test_bench_real_says_in_one_line_that_the_row_is_left_out_without_bindings(monkeypatch, capsys) -> None:
    import argparse

    from specdec.cli.bench_real import _llama_cpp_row

    monkeypatch.setattr(llama_cpp, "llama_cpp_available", lambda: False)
    said: list[str] = []
    args = argparse.Namespace(no_llama_cpp=False, quantize=None, cache=None)
    assert _llama_cpp_row(args, said.append) is None
    assert len(said) == 1 and "no llama.cpp row" in said[0] and "pip install llama-cpp-python" in said[0]
    assert _llama_cpp_row(argparse.Namespace(no_llama_cpp=True, quantize=None, cache=None), said.append) is None
    assert len(said) == 1


def test_a_file_type_llama_cpp_does_not_write_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown llama.cpp file type 'q4_k'"):
        llama_cpp.llama_cpp_file(tmp_path / "m.gguf", "q4_k", tmp_path)
