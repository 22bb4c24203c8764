"""The zoo that ships with the code (`specdec.zoo.shipped`): the same bytes everywhere, verified
at load, and the docs' figures equal to what those bytes give (`specdec.zoo.publish`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from specdec import cli, zoo
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.plugins import make_drafter
from specdec.runtime.target import CausalLM
from specdec.training.distill import evaluate
from specdec.training.target import heldout_loss
from specdec.zoo.measure import decode_prompts, load_students, read_evaluation
from specdec.zoo.publish import stale_blocks
from specdec.zoo.shipped import RECORD, SHIPPED, ZooIntegrityError, open_shipped

# a later prompt (its own seed, seed + i) decoded as well, by a training-free and a learned drafter with no memory of
# earlier outputs (the suffix drafter's figures hold only where the first prompt stands alone); the other rows take
# the first prompt, which is where a row's own decoding differs
LATER_TOO = ("ngram", "eagle3")


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return open_shipped(zoo.FULL, root=tmp_path_factory.mktemp("zoo-cache"), say=lambda line: None)


def test_the_full_and_hybrid_families_ship_small_with_a_checksum_for_every_file():
    assert zoo.shipped_names() == ("full", "hybrid")
    stored = sum(f.stat().st_size for f in SHIPPED.rglob("*") if f.is_file())
    assert stored < 12e6  # half-precision weights, one tokenizer per family, the datastore as its recipe
    for name in ("full", "hybrid"):
        record = json.loads((SHIPPED / name / RECORD).read_text())
        assert record["settings"] == zoo.family(name).record()  # shipped from these settings
        assert all(len(entry["stored_sha256"]) == 64 for entry in record["files"].values())
        assert not list((SHIPPED / name).rglob("*.bin"))  # the suffix arrays are rebuilt, not stored


def test_the_shipped_family_unpacks_to_what_a_build_writes(full: Path):
    assert full.name.startswith("full-shipped-")
    for piece in ("tokenizer", "target", "draft-model", "draft-model-xtok", "medusa", "eagle", "eagle3", "datastore"):
        assert (full / piece).is_dir(), piece
    model = load_causal_lm(full / "target")
    assert next(model.parameters()).dtype == torch.float32
    assert set(zoo.drafter_options(full)) == set(zoo.FULL.drafters) and zoo.unavailable(full) == {}
    said: list[str] = []
    assert zoo.ready(zoo.FULL, root=full.parent, say=said.append) == full
    assert said == []  # verified again, not unpacked again


def test_the_committed_figures_are_what_the_shipped_bytes_give(full: Path):
    """Held-out losses of every piece, and the first prompt's decoding by every drafter and a later
    one's by two (`LATER_TOO`), each made as its zoo label says and given the target's tokenizer,
    equal the committed figures; the docs' blocks render those figures."""
    figures = json.loads((SHIPPED / "full" / "figures.json").read_text())
    evaluation = read_evaluation(full)
    model = load_causal_lm(full / "target").eval()
    with torch.no_grad():
        assert heldout_loss(model, evaluation.windows) == pytest.approx(figures["losses"]["target"]["loss"], abs=2e-3)
        students = load_students(full, model, ["eagle", "mtp"])
        for name, measured in evaluate(model, students, evaluation.windows).items():
            assert measured["loss"] == pytest.approx(figures["losses"][name]["loss"], abs=2e-3), name
            assert measured["agreement"] == pytest.approx(figures["losses"][name]["agreement"], abs=2e-3), name
    tokenizer = load_tokenizer(full / "tokenizer")
    ids = [torch.tensor(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in evaluation.prompts]
    later = len(ids) // 2
    target = CausalLM(model)
    rows = zoo.zoo_drafters(full)
    for label in zoo.FULL.drafters:
        name, options = rows[label]
        chosen = [0, later] if label in LATER_TOO else [0]
        for i in chosen:
            one = type(evaluation)(evaluation.prompts[i:i + 1], evaluation.windows, evaluation.k, evaluation.new_tokens,
                                   evaluation.temperature, evaluation.seed + i)
            _, runs, _ = decode_prompts(target, ids[i:i + 1], make_drafter(name, **options), one, tokenizer=tokenizer,
                                        k=zoo.draft_length(label, evaluation.k))
            assert runs[0].row() == figures["drafters"][label]["prompts"][i], (label, i)
    assert stale_blocks() == []


def test_a_changed_shipped_file_is_an_error_naming_it(tmp_path: Path):
    source = tmp_path / "shipped"
    shutil.copytree(SHIPPED / "hybrid", source / "hybrid")
    weights = source / "hybrid" / "eagle3" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ZooIntegrityError, match=r"eagle3/model.safetensors has SHA-256 .*git checkout"):
        open_shipped(zoo.HYBRID, root=tmp_path / "cache", source=source, say=lambda line: None)
    weights.write_bytes(b"version https://git-lfs.github.com/spec/v1\n")  # a pointer instead of the file
    with pytest.raises(ZooIntegrityError, match="changed or truncated"):
        open_shipped(zoo.HYBRID, root=tmp_path / "cache", source=source, say=lambda line: None)


def test_an_unpacking_that_fails_leaves_nothing_behind(tmp_path: Path, monkeypatch):
    def broken(stored: Path, out: Path, halved: list[str]) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("specdec.zoo.shipped.unpack_weights", broken)
    with pytest.raises(OSError, match="disk full"):
        open_shipped(zoo.HYBRID, root=tmp_path, say=lambda line: None)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_an_unpacked_copy_that_changed_is_unpacked_again(tmp_path: Path):
    said: list[str] = []
    directory = open_shipped(zoo.HYBRID, root=tmp_path, say=said.append)
    config = directory / "target" / "config.json"
    config.write_text(config.read_text().replace("64", "65"))
    assert open_shipped(zoo.HYBRID, root=tmp_path, say=said.append) == directory
    assert any("(target/config.json differs); unpacking it again" in line for line in said)
    assert json.loads(config.read_text()) == json.loads((SHIPPED / "hybrid" / "target" / "config.json").read_text())


def test_settings_that_changed_since_shipping_are_refused(tmp_path: Path):
    from dataclasses import replace

    with pytest.raises(ZooIntegrityError, match="built with other settings"):
        open_shipped(replace(zoo.HYBRID, seed=7), root=tmp_path, say=lambda line: None)


def test_the_cli_points_at_the_shipped_family_and_lists_it(full: Path, capsys):
    assert cli.main(["zoo", "path", "--cache-dir", str(full.parent), "eagle"]) == 0
    assert capsys.readouterr().out.strip() == str(full / "eagle")
    assert cli.main(["zoo", "info", "--cache-dir", str(full.parent)]) == 0
    out = capsys.readouterr().out
    assert "full zoo" in out and "shipped with specdec" in out and "mean acc. len [95%]" in out
