"""`specdec zoo`: the quick family built end to end in a temporary cache directory."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tiny import hf_greedy
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec import cli, zoo
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.data.corpus import stdlib_corpus
from specdec.data.datastore import open_datastore
from specdec.data.prompts import code_prompts
from specdec.zoo.measure import read_evaluation
from specdec.drafters.feature_heads.eagle import load_eagle
from specdec.drafters.feature_heads.eagle3_files import load_eagle3
from specdec.drafters.feature_heads.medusa_files import load_medusa
from specdec.drafters.feature_heads.mtp import load_mtp
from specdec.training.data import encode_corpus, evaluation_windows
from specdec.training.distill import evaluate
from specdec.training.draft_model import DraftModelStudent
from specdec.training.eagle import EagleStudent
from specdec.training.eagle3 import Eagle3Student
from specdec.training.medusa import MedusaStudent
from specdec.training.mtp import MtpStudent, create_mtp_head
from specdec.zoo.store import staging

LEARNED = ("draft-model", "medusa", "eagle", "eagle3", "mtp", "dflash", "pard")
TRAINING_FREE = ("ngram", "lookahead", "suffix", "retrieval")


def test_build_writes_every_piece_and_a_manifest(quick_zoo: Path):
    assert quick_zoo.name == f"quick-{zoo.QUICK.key()}"
    record = zoo.manifest(quick_zoo)
    assert record["key"] == zoo.QUICK.key() and record["settings"]["vocab_size"] == 512
    for piece, directory in zoo.PIECES.items():  # every piece of its drafters (not draft-model-xtok)
        assert (quick_zoo / directory).is_dir() == (piece != zoo.XTOK), piece
    pieces = record["pieces"]
    assert set(pieces) == {"tokenizer", "target", *LEARNED, *TRAINING_FREE}
    assert set(zoo.drafter_options(quick_zoo)) == {*LEARNED, *TRAINING_FREE}
    figures = zoo.read_figures(quick_zoo)
    for name in ("target", *LEARNED):
        assert pieces[name]["parameters"] > 0 and 0 < figures["losses"][name]["loss"] < 10, name
    assert figures["evaluation"] == {"prompts": 3, "windows": [8, 128], "k": 4, "new_tokens": 24,
                                     "temperature": 0.5, "seed": 0}
    for name in (*LEARNED, *TRAINING_FREE):
        accepted = figures["drafters"][name]
        interval = accepted["mean_accepted_length"]
        assert 1.0 <= interval["low"] <= interval["estimate"] <= interval["high"] <= 1 + zoo.draft_length(name, 4), name
        rows = accepted["prompts"]  # per prompt: tokens, forwards, drafted, accepted, loop-accepted, loop tokens
        assert len(rows) == 3 and interval["estimate"] == pytest.approx(sum(r[0] for r in rows) / sum(r[1] for r in rows))
        assert all(r[0] == 24 and r[3] + r[1] >= r[0] >= r[1] and 0 <= r[4] <= r[3] for r in rows), name
    assert record["target_forward_seconds"] > 0 and record["costs"]["k"] == 4
    for name in (*LEARNED, *TRAINING_FREE):  # every drafter's draft tax, per drafter forward where it has one
        cost = pieces[name]["draft_cost"]
        assert cost["draft_seconds"] > 0 and cost["draft_tax"] == pytest.approx(
            cost["draft_seconds"] / record["target_forward_seconds"]), name
        if name in TRAINING_FREE:
            assert cost["model_steps"] == 0 and cost["step_seconds"] is None, name
        else:
            assert cost["model_steps"] == (1 if name in ("medusa", "dflash", "pard") else 4), name  # blocks: one forward
            assert cost["step_ratio"] == pytest.approx(cost["draft_tax"] / cost["model_steps"]), name
    open_datastore(quick_zoo / "datastore").check_vocab(512)
    assert figures["losses"]["target"]["loss"] < figures["losses"]["draft-model"]["loss"]
    assert [p.text for p in read_evaluation(quick_zoo).prompts] == [p.text for p in code_prompts(stdlib_corpus(),
                                                                                                 per_category=1)]
    assert record["corpus"]["heldout_files"] >= 0.05 * (record["corpus"]["train_files"] + record["corpus"]["heldout_files"])
    assert not list(quick_zoo.parent.glob(".*.partial"))


def test_a_finished_build_is_reused(quick_zoo: Path):
    before = (quick_zoo / "manifest.json").stat().st_mtime_ns
    said: list[str] = []
    assert zoo.build(zoo.QUICK, root=quick_zoo.parent, show_progress=False, log=said.append) == quick_zoo
    assert said == [] and (quick_zoo / "manifest.json").stat().st_mtime_ns == before


def test_tokenizer_loads_with_autotokenizer_and_round_trips_code(quick_zoo: Path):
    tokenizer = AutoTokenizer.from_pretrained(quick_zoo / "tokenizer")
    text = "def área(x):\n    return x ** 2  # ünïcode\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(tokenizer) == 512 and max(ids) < 512 and tokenizer.decode(ids) == text
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 0
    assert load_tokenizer(quick_zoo / "target").get_vocab() == tokenizer.get_vocab()


def test_target_is_a_qwen3_checkpoint_holding_an_mtp_module(quick_zoo: Path):
    model = AutoModelForCausalLM.from_pretrained(quick_zoo / "target")
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.eos_token_id == 0
    with safe_open(str(quick_zoo / "target" / "model.safetensors"), framework="pt") as handle:
        keys = set(handle.keys())
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
            "mtp.norm.weight"} <= keys
    assert any(key.startswith("mtp.layers.0.self_attn.") for key in keys)
    head = load_mtp(quick_zoo / "target")
    assert head.layout == "qwen" and len(head.stages) == 1


def test_each_piece_reloads_through_its_drafter_and_keeps_greedy_parity(quick_zoo: Path):
    model = load_causal_lm(quick_zoo / "target", dtype=torch.float64)  # float64: no near-tie argmax flips
    tokenizer = load_tokenizer(quick_zoo / "target")
    prompts = [tokenizer(p.text, add_special_tokens=False)["input_ids"]
               for p in code_prompts(stdlib_corpus(), per_category=1)]
    target = specdec.CausalLM(model)
    for prompt in prompts:
        expected = hf_greedy(model, prompt, 20)
        for name, options in zoo.drafter_options(quick_zoo).items():
            tree = specdec.plugins.drafter_class(name).tree_options
            for mode in ({}, tree) if tree else ({},):  # the zoo's mode (a chain), then the drafter's token trees
                drafter = specdec.make_drafter(name, **{**options, **mode})
                result = specdec.generate(target, prompt, drafter=drafter, num_draft_tokens=3, max_new_tokens=20)
                assert result.tokens == expected, (name, mode)
                assert result.stats.drafted > 0, (name, mode)


def test_two_builds_with_the_same_settings_give_identical_files(quick_zoo: Path, tmp_path: Path, monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(sys.modules["specdec.zoo.build"], "ships", lambda name: True)  # a shipped family's rebuild
    again = zoo.build(zoo.QUICK, root=tmp_path, show_progress=False, log=said.append)
    assert any("this build's figures may differ from the shipped family's" in line for line in said)
    files = sorted(p.relative_to(quick_zoo) for p in quick_zoo.rglob("*") if p.is_file() and p.name != "manifest.json")
    assert files == sorted(p.relative_to(again) for p in again.rglob("*")
                           if p.is_file() and p.name != "manifest.json")
    for name in files:
        if name.suffix == ".safetensors":
            with safe_open(str(quick_zoo / name), framework="pt") as a, safe_open(str(again / name), framework="pt") as b:
                assert set(a.keys()) == set(b.keys())
                for key in a.keys():
                    assert torch.equal(a.get_tensor(key), b.get_tensor(key)), (name, key)
        else:
            assert (quick_zoo / name).read_bytes() == (again / name).read_bytes(), name


def test_learned_drafters_agree_with_the_target_far_above_chance_on_held_out_text(quick_zoo: Path):
    target = load_causal_lm(quick_zoo / "target")
    tokenizer = load_tokenizer(quick_zoo / "target")
    corpus = stdlib_corpus()
    windows = evaluation_windows(encode_corpus(tokenizer, corpus, 0, 50_000, 100_000).heldout, 128, 8)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    trained = [DraftModelStudent(load_causal_lm(quick_zoo / "draft-model")), MedusaStudent(load_medusa(quick_zoo / "medusa")),
               EagleStudent(load_eagle(quick_zoo / "eagle"), embed, lm_head),
               MtpStudent(load_mtp(quick_zoo / "target"), embed, lm_head),
               Eagle3Student(load_eagle3(quick_zoo / "eagle3"), embed)]
    data = encode_corpus(tokenizer, corpus, 0, 50_000, 1_000).train
    fresh = [DraftModelStudent.create(zoo.QUICK.draft, target, seed=7), MedusaStudent.create(3, 1, lm_head, seed=7),
             EagleStudent.create(target, seed=7), MtpStudent(create_mtp_head(target.config, 7), embed, lm_head),
             Eagle3Student.create(target, data, seed=7, draft_vocab=zoo.QUICK.eagle3_vocab,
                                  layers=zoo.QUICK.eagle3_layers)]
    learned, untrained = evaluate(target, trained, windows), evaluate(target, fresh, windows)
    for name in learned:  # the distilled students (the quick family trains its block drafters a few steps only)
        assert learned[name]["agreement"] > 50 / 512, (name, learned[name])  # chance: about 1/512
        assert learned[name]["agreement"] > untrained[name]["agreement"] + 0.05, (name, learned, untrained)
        assert learned[name]["loss"] < untrained[name]["loss"], name


def test_an_interrupted_build_leaves_nothing_and_the_next_one_starts_clean(tmp_path: Path):
    settings = replace(zoo.QUICK, name="interrupted")
    with pytest.raises(KeyboardInterrupt):
        with staging(settings, tmp_path) as work:
            assert work is not None
            (work / "half-written.safetensors").write_bytes(b"\0" * 10)
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == [tmp_path / f".{settings.directory_name}.lock"]
    assert not zoo.finished(settings, tmp_path)
    stale = tmp_path / f".{settings.directory_name}.partial"
    stale.mkdir()
    (stale / "junk").write_text("left by a killed build")
    with pytest.raises(RuntimeError, match="without writing manifest.json"):
        with staging(settings, tmp_path) as work:
            assert work is not None and list(work.iterdir()) == []
    assert not stale.exists() and not zoo.family_dir(settings, tmp_path).exists()


def test_settings_key_changes_with_any_setting():
    assert zoo.QUICK.key() != replace(zoo.QUICK, seed=1).key()
    assert zoo.QUICK.key() != replace(zoo.QUICK, vocab_size=600).key()
    assert zoo.QUICK.key() == replace(zoo.QUICK).key() and zoo.QUICK.key() != zoo.FULL.key()


def test_cache_root_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert zoo.cache_root() == tmp_path / "specdec" / "zoo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert zoo.cache_root() == Path.home() / ".cache" / "specdec" / "zoo"
    assert zoo.cache_root(tmp_path / "x") == tmp_path / "x"


def test_zoo_info_and_path_commands(quick_zoo: Path, capsys: pytest.CaptureFixture[str]):
    root = str(quick_zoo.parent)
    assert cli.main(["zoo", "build", "--quick", "--cache-dir", root, "--no-progress"]) == 0  # reused, not rebuilt
    assert capsys.readouterr().out.strip() == str(quick_zoo)
    assert cli.main(["zoo", "info", "--cache-dir", root]) == 0
    out = capsys.readouterr().out
    assert f"quick zoo ({zoo.QUICK.key()}, built here): {quick_zoo}" in out
    for piece in ("target", *LEARNED):
        assert any(line.split()[:1] == [piece] for line in out.splitlines()), piece
    assert cli.main(["zoo", "path", "eagle", "--quick", "--cache-dir", root]) == 0
    assert capsys.readouterr().out.strip() == str(quick_zoo / "eagle")
    assert cli.main(["zoo", "path", "mtp", "--quick", "--cache-dir", root]) == 0
    assert capsys.readouterr().out.strip() == str(quick_zoo / "target")
    assert cli.main(["zoo", "path", "target", "--built", "--cache-dir", root]) == 2  # no full family built here
    assert "not built" in capsys.readouterr().err


def test_zoo_info_on_an_empty_cache_says_how_to_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert cli.main(["zoo", "info", "--cache-dir", str(tmp_path)]) == 0
    assert "specdec zoo build" in capsys.readouterr().out


def test_manifest_records_versions_and_is_json(quick_zoo: Path):
    record = json.loads((quick_zoo / "manifest.json").read_text())
    assert record["versions"]["torch"] == torch.__version__ and record["build_seconds"] > 0
    assert os.path.isabs(record["corpus"]["root"])
