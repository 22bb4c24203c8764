"""The zoo's hybrid family (the Qwen3.5 case): a Qwen3.5-layout target trained with one MTP module,
its drafters, and the demo's section on it, on the quick settings."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

import specdec
from specdec import cli, zoo
from specdec.checkpoints import load_causal_lm
from specdec.runtime.linear import LinearStates
from specdec.zoo.settings import HYBRID_DRAFTERS

from test_demo import _table_rows, demo
from tiny import hf_greedy


@pytest.fixture(scope="module")
def hybrid_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zoo.build(zoo.HYBRID_QUICK, root=tmp_path_factory.mktemp("zoo-cache"), show_progress=False,
                     log=lambda line: None)


def test_the_hybrid_family_is_a_qwen35_layout_target_with_its_drafters(hybrid_zoo: Path):
    record = zoo.manifest(hybrid_zoo)
    assert record["settings"]["drafters"] == list(HYBRID_DRAFTERS)
    assert set(record["pieces"]) == {"tokenizer", "target", *HYBRID_DRAFTERS}
    assert not (hybrid_zoo / "medusa").exists() and not (hybrid_zoo / "datastore").exists()
    config = json.loads((hybrid_zoo / "target" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"] and config["mtp_num_hidden_layers"] == 1
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    figures = zoo.read_figures(hybrid_zoo)
    for name in HYBRID_DRAFTERS:
        accepted = figures["drafters"][name]["mean_accepted_length"]["estimate"]
        assert 1.0 <= accepted <= 5.0 and record["pieces"][name]["draft_cost"]["draft_seconds"] > 0, name
    assert set(zoo.drafter_options(hybrid_zoo)) == set(HYBRID_DRAFTERS)


def test_every_hybrid_drafter_decodes_the_target_exactly(hybrid_zoo: Path):
    """Each drafter of the family, chains and trees, on the static cache (linear layers kept per
    row): the tokens are transformers' greedy ones."""
    model = load_causal_lm(hybrid_zoo / "target")
    prompt = [5, 17, 60, 5, 17, 60, 5]
    expected = hf_greedy(model, prompt, 12)
    lm = specdec.CausalLM(model)
    for name, options in zoo.drafter_options(hybrid_zoo).items():
        for tree in (False, True):
            extra = specdec.plugins.drafter_class(name).tree_options if tree else {}
            drafter = specdec.make_drafter(name, **options, **extra)
            result = specdec.generate(lm, prompt, drafter=drafter, max_new_tokens=12)
            assert result.tokens == expected, (name, tree)
    assert lm.static and any(isinstance(layer, LinearStates) for layer in lm.cache.layers)


def test_the_demo_tells_the_hybrid_story(hybrid_zoo: Path):
    """`make demo`'s hybrid section, eager here (the suite's compile budget): plain, MTP chains and
    MTP trees on the hybrid target, the same tokens, and a draft-tax line for each."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = demo.main(["--quick", "--family", "hybrid", "--eager", "--cache-dir", str(hybrid_zoo.parent),
                          "--prompts", "1", "--new-tokens", "12", "--repeats", "1", "--no-progress"])
    output = buffer.getvalue()
    assert code == 0, output
    assert "The Qwen3.5 case: a hybrid target of 4 layers (3 GatedDeltaNet" in output
    rows = _table_rows(output)
    assert [row["drafter"] for row in rows] == ["plain", "mtp", "mtp+tree"]
    assert {row["lossless"] for row in rows} == {"yes"}
    assert any(line.strip().startswith("mtp+tree") and "target forwards" in line for line in output.splitlines())


def test_the_hybrid_benchmark_measures_before_and_after_the_curve_and_the_state_memory(hybrid_zoo: Path, capsys):
    """`python -m specdec.bench.hybrid_zoo`, shrunk and eager: both designs decode every row as
    plain decoding does, and the state bytes per verify position read back from the buffers
    equal those computed from the config."""
    from specdec.bench import hybrid_zoo as bench

    code = bench.main(["--quick", "--eager", "--cache-dir", str(hybrid_zoo.parent), "--prompts", "1", "--new-tokens",
                       "8", "--repeats", "1", "--batches", "1", "2"])
    output = capsys.readouterr().out
    assert code == 0, output
    assert output.count("before: snapshot + replay, eager") == 3 and output.count("after: eager") == 3
    config = load_causal_lm(hybrid_zoo / "target").config
    computed = bench.slot_bytes(config, torch.float32) / 2**10
    assert computed == 3 * (4 * 16 * 16 * 4 + (2 * 2 * 16 + 4 * 16) * 4) / 2**10  # 3 layers: a state, a conv input
    assert f"per verify position {computed:.1f} KiB (computed)" in output
    assert f"{computed:.1f} KiB per slot (read back)" in output
    assert "B=1" in output and "B=2" in output and "mtp" in output and "ngram" in output


def test_the_cli_names_the_hybrid_family(hybrid_zoo: Path, capsys):
    assert cli.main(["zoo", "path", "--hybrid", "--quick", "--cache-dir", str(hybrid_zoo.parent), "target"]) == 0
    assert capsys.readouterr().out.strip() == str(hybrid_zoo / "target")
    with pytest.raises(FileNotFoundError, match="the hybrid-quick zoo has no medusa .*draft-model, eagle3"):
        zoo.piece_dir(zoo.HYBRID_QUICK, "medusa", root=hybrid_zoo.parent)


def test_a_hybrid_target_needs_its_layers_in_fours():
    from specdec.training.target import TargetSize, target_config

    with pytest.raises(ValueError, match="layers in fours .* got layers=6"):
        target_config(TargetSize(hidden=32, layers=6, heads=2, kv_heads=1, architecture="qwen3_5"), 64, 0)
    with pytest.raises(ValueError, match="architecture must be one of .* got 'mamba'"):
        TargetSize(architecture="mamba")


def test_a_family_built_before_families_named_their_drafters_offers_every_drafter(tmp_path: Path):
    (tmp_path / "manifest.json").write_text(json.dumps({"settings": {"name": "full"}}))
    assert set(zoo.drafter_options(tmp_path)) == set(zoo.settings.LEARNED + zoo.settings.TRAINING_FREE + zoo.settings.VARIANTS)
