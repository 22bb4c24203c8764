"""The batch curve (`specdec bench --batch`) and `specdec generate --prompts`: records per
contender and batch size, where a drafter stops paying, the noisy flag, the table, the plot,
and the command lines."""

from __future__ import annotations

import json

import pytest
import torch

from specdec.bench.batch_curve import BatchCurveConfig, curve_table, run_curve, stops_paying
from specdec.bench.plots import write_batch_plot
from specdec.bench.runner import Contender
from specdec.cli.common import CLIError
from specdec.cli.generate import read_prompts
from specdec.cli import main
from tiny import tiny_model

PROMPTS = [[5, 9, 14, 22, 5, 9, 14, 22], [7, 7, 7], [3, 8, 3, 8, 3, 8, 3]]


def _record(label: str, batch: int, speedup: float, spread: float = 0.01) -> dict:
    figure = {"median": speedup, "spread": spread, "rounds": [speedup]}
    return {"contender": label, "drafter": None if label == "plain" else label, "tree": False, "peer": None,
            "batch": batch, "tokens_per_second": {"median": 100 * speedup, "spread": spread, "rounds": [1.0]},
            "speedup": figure, "mean_accepted_length": figure, "same_as_plain": True, "noise_bound": 0.1,
            "noisy": spread > 0.1}


def test_the_curve_runs_every_contender_at_every_batch_size_and_checks_the_tokens():
    model = tiny_model("llama", vocab_size=64, dtype=torch.float32)
    contenders = (Contender("plain"), Contender("ngram", "ngram", {"max_ngram": 3}, 3))
    config = BatchCurveConfig(batches=(1, 3), contenders=contenders, max_new_tokens=8, repeats=2, warmup=0)
    records = run_curve(model, PROMPTS, config)
    assert sorted((r["contender"], r["batch"]) for r in records) == sorted(
        (label, b) for label in ("plain", "ngram", "hf-batched") for b in (1, 3))
    for record in records:
        assert len(record["tokens_per_second"]["rounds"]) == 2 and record["tokens_per_second"]["median"] > 0
        if record["peer"] is None:
            assert record["same_as_plain"] is True
    plain = [r for r in records if r["contender"] == "plain"]
    assert all(r["speedup"]["median"] == 1.0 for r in plain)


def test_a_drafter_stops_paying_at_the_first_batch_size_below_one():
    records = [_record("plain", b, 1.0) for b in (1, 2, 4, 8)]
    records += [_record("eagle", 1, 2.0), _record("eagle", 2, 1.3), _record("eagle", 4, 0.9), _record("eagle", 8, 1.1)]
    records += [_record("ngram", b, 1.5) for b in (1, 2, 4, 8)]
    assert stops_paying(records) == {"eagle": 4, "ngram": None}
    text = curve_table(records)
    assert "eagle" in text and "B=4" in text.splitlines()[2 + 1] and "pays at every B measured" in text


def test_a_cell_spreading_past_the_bound_is_marked_in_the_table_and_the_plot(tmp_path):
    records = [_record("plain", b, 1.0) for b in (1, 2)] + [_record("eagle", 1, 2.0), _record("eagle", 2, 1.2, 0.4)]
    assert "1.20x~" in curve_table(records) and "2.00x~" not in curve_table(records)
    path = write_batch_plot(records, tmp_path)
    assert path.is_file() and path.stat().st_size > 1000


def test_bad_batch_sizes_are_refused():
    with pytest.raises(ValueError, match="batch sizes >= 1"):
        BatchCurveConfig(batches=(0, 2), contenders=(Contender("plain"),))
    with pytest.raises(ValueError, match="twice"):
        BatchCurveConfig(batches=(2, 2), contenders=(Contender("plain"),))


def test_bench_batch_writes_the_curve(tmp_path, capsys):
    model_dir = _checkpoint(tmp_path)
    out = tmp_path / "out"
    status = main(["bench", "--target", str(model_dir), "--batch", "1", "2", "--drafter", "ngram", "--k", "2",
                   "--max-new-tokens", "6", "--repeats", "1", "--warmup", "0", "--no-progress", "--no-peers",
                   "--engine", "eager", "--prompts", str(_questions(tmp_path)), "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    document = json.loads((out / "batch.json").read_text())
    assert document["schema"] == "specdec-batch/1" and set(document["stops_paying"]) == {"ngram"}
    assert {r["batch"] for r in document["records"]} == {1, 2}
    assert "stops paying at" in printed and (out / "plots" / "batch_speedup.png").is_file()
    assert main(["bench", "--target", str(model_dir), "--batch", "2", "--k", "2", "4", "--no-progress"]) == 2
    assert "give one --k (an int or auto)" in capsys.readouterr().err
    auto = tmp_path / "auto"  # num_draft_tokens="auto" at every batch size
    assert main(["bench", "--target", str(model_dir), "--batch", "1", "2", "--drafter", "ngram", "--k", "auto",
                 "--max-new-tokens", "6", "--repeats", "1", "--warmup", "0", "--no-progress", "--no-peers",
                 "--engine", "eager", "--prompts", str(_questions(tmp_path)), "--out", str(auto)]) == 0
    records = json.loads((auto / "batch.json").read_text())["records"]
    assert {r["contender"] for r in records} == {"plain", "ngram:k=auto"}
    assert all(r["same_as_plain"] for r in records if r["contender"] != "plain")


def test_generate_prompts_decodes_every_line_in_one_batch(tmp_path, capsys):
    model_dir = _checkpoint(tmp_path)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2 w3 w1 w2\n\nw3 w3 w3\n")
    status = main(["generate", "--target", str(model_dir), "--prompts", str(prompts), "--drafter", "ngram",
                   "--max-new-tokens", "5"])
    printed = capsys.readouterr().out
    assert status == 0
    assert printed.count("--- prompt") == 2 and "--- batch of 2" in printed and printed.count("stats:") == 3
    assert read_prompts(str(_questions(tmp_path))) == ["w1 w2 w1 w2", "w3 w2 w3"]
    with pytest.raises(CLIError, match="does not exist"):
        read_prompts(str(tmp_path / "missing.txt"))
    assert main(["generate", "--target", str(model_dir), "--prompts", str(prompts), "a prompt"]) == 2
    assert "not both" in capsys.readouterr().err


def _questions(tmp_path):
    path = tmp_path / "question.jsonl"
    lines = [{"question_id": 1, "category": "x", "turns": ["w1 w2 w1 w2"]}, {"question_id": 2, "turns": ["w3 w2 w3"]}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def _checkpoint(tmp_path):
    """A tiny Llama and a word-level tokenizer saved as one checkpoint directory."""
    from test_datastore import word_tokenizer

    directory = tmp_path / "model"
    if not directory.exists():
        tokenizer = word_tokenizer()
        model = tiny_model("llama", vocab_size=len(tokenizer), dtype=torch.float32)
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    return directory
