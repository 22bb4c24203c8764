"""`specdec export dflash`: a DFlash drafter written in the z-lab layout vLLM and SGLang load holds
the config fields and tensor names each engine reads (`specdec.export.layouts`), reads back through
specdec's loader with identical drafts, and is refused where the engines cannot serve it.

A tiny random float64 drafter (2 layers, block 8) for a tiny 4-layer Qwen3 target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import Qwen3Config

import specdec
from specdec.cli import main
from specdec.drafters.parallel.dflash import DFlashDrafter
from specdec.drafters.parallel.dflash_files import load_dflash, save_dflash
from specdec.drafters.parallel.dflash_head import DFlashHead, DFlashSpec
from specdec.export import export, layout_for, mismatches, read_back

from test_export import Recorder
from tiny import tiny_model

VOCAB, HIDDEN, BLOCK, MASK, TARGET_LAYERS = 64, 32, 8, 63, 4
PROMPT = [5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14]
ENGINES = ("vllm", "sglang")


def random_dflash(directory: Path, seed: int = 0, layer_ids: tuple[int, ...] = (0, 2),
                  num_target_layers: int | None = TARGET_LAYERS, hidden: int = HIDDEN) -> Path:
    torch.manual_seed(seed)
    config = Qwen3Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=hidden // 4, vocab_size=VOCAB, max_position_embeddings=128,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    head = DFlashHead(DFlashSpec(config, BLOCK, MASK, layer_ids, num_target_layers)).double()
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.normal_(0.0, 0.5) if parameter.dim() == 2 else parameter.uniform_(0.5, 1.5)
    return save_dflash(head, directory)


@pytest.fixture(scope="module")
def target():
    return tiny_model("qwen3", vocab_size=VOCAB, hidden=HIDDEN, layers=TARGET_LAYERS)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_dflash(tmp_path_factory.mktemp("src") / "dflash")


def stored(directory: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (safe_open is not iterable)


def drafts_of(path: Path, target: Any) -> tuple[list[int], list[list[int]]]:
    recorder = Recorder(DFlashDrafter(path, sample=False))
    result = specdec.generate(target, PROMPT, drafter=recorder, num_draft_tokens=BLOCK - 1, max_new_tokens=16)
    assert result.stats.drafted > 0
    return result.tokens, recorder.drafts


@pytest.mark.parametrize("engine", ENGINES)
def test_export_reads_back_through_specdec_with_identical_drafts(engine, source, target, tmp_path):
    out = export("dflash", source, engine, tmp_path / "out")
    back = read_back("dflash", out, engine, tmp_path / "scratch")
    assert drafts_of(back, target) == drafts_of(source, target)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging left"


@pytest.mark.parametrize("engine", ENGINES)
def test_export_holds_the_fields_and_tensor_names_the_engine_reads(engine, source, tmp_path):
    out = export("dflash", source, engine, tmp_path / "out")
    config, tensors = json.loads((out / "config.json").read_text()), stored(out)
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors"}
    assert mismatches(layout_for("dflash", engine), tensors, config) == []
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": [0, 2], "block_size": BLOCK}
    assert (config["block_size"], config["num_target_layers"], config["rope_theta"]) == (BLOCK, TARGET_LAYERS, 10000.0)
    assert config["tie_word_embeddings"] is False and "auto_map" not in config
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == HIDDEN
    assert not any(key.startswith(("model.", "embed_tokens", "lm_head")) for key in tensors)  # unprefixed, the target's
    assert {"layers.1.self_attn.q_proj.weight", "layers.1.self_attn.k_proj.weight", "layers.1.self_attn.v_proj.weight",
            "layers.1.mlp.gate_proj.weight", "layers.1.mlp.up_proj.weight"} <= tensors.keys()  # not fused
    assert tensors["fc.weight"].shape == (HIDDEN, 2 * HIDDEN)  # K fused layers x the target's hidden size
    original = stored(source)
    assert tensors.keys() == original.keys() and all(torch.equal(tensors[k], original[k]) for k in original)


def test_a_departure_from_the_dflash_layout_is_named(source, tmp_path):
    out = export("dflash", source, "vllm", tmp_path / "out")
    keys = set(stored(out)) - {"layers.0.self_attn.q_proj.weight", "layers.1.self_attn.q_proj.weight"}
    keys |= {"embed_tokens.weight", "layers.0.self_attn.qkv_proj.weight"}
    config = {**json.loads((out / "config.json").read_text()), "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}}
    del config["num_target_layers"]
    problems = mismatches(layout_for("dflash", "sglang"), keys, config)
    assert any("'embed_tokens.weight' matches no" in p for p in problems), problems
    assert any("'layers.0.self_attn.qkv_proj.weight' matches no" in p for p in problems), problems
    assert any("self_attn.q_proj.weight" in p and "no key matches" in p for p in problems), problems
    assert any("has 'auto_map'" in p for p in problems) and any("lacks 'num_target_layers'" in p for p in problems)


def test_a_target_fills_the_layer_count_and_context_and_a_wrong_one_is_refused(tmp_path, target):
    src = random_dflash(tmp_path / "no-count", num_target_layers=None)
    with pytest.raises(ValueError, match="num_target_layers.*pass --target"):
        export("dflash", src, "sglang", tmp_path / "a")
    directory = tmp_path / "target"
    target.save_pretrained(directory)
    out = export("dflash", src, "sglang", tmp_path / "b", target=directory)
    config = json.loads((out / "config.json").read_text())
    assert config["num_target_layers"] == TARGET_LAYERS
    assert config["max_position_embeddings"] == target.config.max_position_embeddings  # 256 > the drafter's 128
    assert load_dflash(out).spec.num_target_layers == TARGET_LAYERS
    narrow = random_dflash(tmp_path / "narrow", hidden=16)
    with pytest.raises(ValueError, match="hidden size 16 but --target .* has 32"):
        export("dflash", narrow, "vllm", tmp_path / "c", target=directory)
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_drafter_fusing_the_last_layers_output_is_refused(engine, tmp_path):
    src = random_dflash(tmp_path / "last", layer_ids=(0, 3))  # layer 3 of 4: after the final norm in transformers
    with pytest.raises(ValueError, match=r"\[0, 3\].*layers 0\.\.2 of a 4-layer target"):
        export("dflash", src, engine, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_failure_midway_leaves_nothing_behind(source, tmp_path, monkeypatch):
    import specdec.export.dflash as module

    def fail(path: Path, data: dict[str, Any]) -> None:  # the config comes after the weights
        assert any(path.parent.iterdir()), "the weights were written before the failure"
        raise OSError(f"disk full writing {path.name}")

    monkeypatch.setattr(module, "write_json", fail)
    (tmp_path / "exports").mkdir()
    with pytest.raises(OSError, match="disk full"):
        export("dflash", source, "vllm", tmp_path / "exports" / "out")
    assert list((tmp_path / "exports").iterdir()) == []


@pytest.mark.parametrize("engine", ENGINES)
def test_cli_exports_dflash_for_each_engine(engine, source, tmp_path, capsys):
    out = tmp_path / engine
    assert main(["export", "dflash", str(source), "--to", engine, "--out", str(out)]) == 0
    assert f"exported dflash for {engine} to {out}" in capsys.readouterr().out
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
