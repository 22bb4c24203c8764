"""`specdec train`: each drafter kind trained for a zoo target on a few text files, reloaded
through its drafter, measured, and refused with a clear error on bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import specdec
from specdec import cli
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.data.corpus import stdlib_corpus

QUICK_ARGS = ["--steps", "3", "--batch-size", "2", "--seq-len", "32", "--no-progress", "--hidden", "16",
              "--layers", "1", "--attention-heads", "2", "--kv-heads", "1", "--medusa-heads", "2",
              "--draft-vocab", "400"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eighteen small standard-library files: 17 to train on, 2 held out (ceil(18 / 16))."""
    directory = tmp_path_factory.mktemp("data")
    corpus = stdlib_corpus()
    small = [p for p in corpus.train if 2_000 < p.stat().st_size < 6_000][:18]
    for i, path in enumerate(small):
        shutil.copy(path, directory / f"{i:02d}_{path.name}")
    return directory


@pytest.mark.parametrize("kind, option", [("draft-model", "model"), ("medusa", "path"), ("eagle", "path"),
                                          ("eagle3", "path"), ("mtp", "path")])
def test_each_kind_trains_saves_and_decodes_losslessly(kind: str, option: str, quick_zoo: Path, data_dir: Path,
                                                       tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / kind
    code = cli.main(["train", kind, "--target", str(quick_zoo / "target"), "--data", str(data_dir), "--out", str(out),
                     *QUICK_ARGS])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert f"saved {kind} to {out}" in printed and "mean accepted length" in printed
    report = json.loads((out / "specdec_training.json").read_text())
    assert report["kind"] == kind and 1.0 <= report["mean_accepted_length"] <= 5.0
    assert 0.0 <= report["heldout"]["agreement"] <= 1.0 and report["heldout_tokens"] > 0
    assert not list(tmp_path.glob(".*.partial"))
    model = load_causal_lm(quick_zoo / "target", dtype=torch.float64)
    prompt = load_tokenizer(quick_zoo / "target")("def parse(text):\n    ", add_special_tokens=False)["input_ids"]
    plain = specdec.generate(model, prompt, max_new_tokens=12).tokens
    drafter = specdec.make_drafter(kind, **{option: str(out)})
    assert specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=3, max_new_tokens=12).tokens == plain


def test_mtp_output_is_the_target_checkpoint_with_its_new_module(quick_zoo: Path, data_dir: Path, tmp_path: Path):
    out = tmp_path / "with-mtp"
    assert cli.main(["train", "mtp", "--target", str(quick_zoo / "target"), "--data", str(data_dir), "--out", str(out),
                     *QUICK_ARGS, "--seed", "5"]) == 0
    from specdec.drafters.feature_heads.mtp import load_mtp

    new, old = load_mtp(out).state_dict(), load_mtp(quick_zoo / "target").state_dict()
    assert new.keys() == old.keys() and any(not torch.equal(new[k], old[k]) for k in new)
    reloaded, original = load_causal_lm(out).state_dict(), load_causal_lm(quick_zoo / "target").state_dict()
    assert all(torch.equal(reloaded[k], original[k]) for k in original)  # the target itself is untouched


def test_bad_input_is_a_one_line_error(quick_zoo: Path, data_dir: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]):
    target = str(quick_zoo / "target")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("someone's file")
    cases = [(["--data", str(data_dir), "--out", str(taken)], "exists and is not an empty directory"),
             (["--data", str(tmp_path / "missing"), "--out", str(tmp_path / "a")], "does not exist"),
             (["--data", str(data_dir), "--out", str(tmp_path / "b"), "--steps", "0"], "steps must be an int >= 1"),
             (["--data", str(data_dir), "--out", str(tmp_path / "c"), "--k", "0"], "--k must be >= 1")]
    for extra, message in cases:
        assert cli.main(["train", "medusa", "--target", target, *extra, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert (taken / "keep.txt").read_text() == "someone's file"
    assert cli.main(["train", "eagle", "--target", str(tmp_path), "--data", str(data_dir),
                     "--out", str(tmp_path / "d"), "--no-progress"]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


@pytest.fixture(scope="module")
def llama_target(quick_zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with untied embeddings and the quick zoo's tokenizer: not the zoo's architecture."""
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, eos_token_id=0)
    LlamaForCausalLM(config).save_pretrained(directory)
    load_tokenizer(quick_zoo / "tokenizer").save_pretrained(str(directory))
    return directory


@pytest.mark.parametrize("kind, option", [("draft-model", "model"), ("medusa", "path"), ("eagle", "path"),
                                          ("eagle3", "path"), ("mtp", "path")])
def test_any_causal_lm_can_be_the_target(kind: str, option: str, llama_target: Path, data_dir: Path, tmp_path: Path):
    out = tmp_path / kind
    assert cli.main(["train", kind, "--target", str(llama_target), "--data", str(data_dir), "--out", str(out),
                     *QUICK_ARGS]) == 0
    model = load_causal_lm(llama_target, dtype=torch.float64)
    prompt = list(range(5, 25))
    plain = specdec.generate(model, prompt, max_new_tokens=10).tokens
    drafter = specdec.make_drafter(kind, **{option: str(out)})
    assert specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=3, max_new_tokens=10).tokens == plain
