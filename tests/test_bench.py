"""`specdec bench` on the quick zoo: a Spec-Bench file with a two-turn question, the JSON
schema, and figures consistent with the runs they summarise."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

import specdec
from specdec import cli, zoo
from specdec.bench.questions import load_questions, turn_prompt
from specdec.bench.runner import AUTO_MAX
from specdec.bench.report import MEASURES, SCHEMA, ideal_speedup
from specdec.bench.session import contenders_for, drafts_trees
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.decoding.adaptive import AdaptiveDraftLength
from specdec.runtime.timing import forward_costs
from specdec.types import Draft
from specdec.zoo.measure import read_evaluation
from specdec.verifier import DEFAULT_RULE, DraftError

K = 3
NEW = 12


@pytest.fixture(scope="module")
def spec_bench_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "question.jsonl"
    lines = [{"question_id": 1, "category": "coding", "turns": ["def fibonacci(n):\n    ", "def factorial(n):\n"]},
             {"question_id": "q2", "category": "docs", "turns": ["class Stack:\n    \"\"\"A stack of items."]}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


@pytest.fixture(scope="module")
def bench_run(quick_zoo: Path, spec_bench_file: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("bench")
    code = cli.main(["bench", "--quick", "--cache-dir", str(quick_zoo.parent), "--prompts", str(spec_bench_file),
                     "--k", str(K), "auto", "--repeats", "2", "--max-repeats", "2", "--warmup", "1",
                     "--max-new-tokens", str(NEW),
                     "--engine", "eager", "--out", str(out), "--no-progress"])  # compiled rows: the test below
    return code, out, json.loads((out / "results.json").read_text())


def test_bench_writes_table_json_csv_and_plots(bench_run, capsys: pytest.CaptureFixture[str]):
    code, out, document = bench_run
    assert code == 0
    assert document["schema"] == SCHEMA and document["settings"]["questions"] == 2
    assert document["settings"]["verify_rules"] == [DEFAULT_RULE]  # off the family's prompts, the library's rule
    assert document["settings"]["turns"] == 3 and document["settings"]["ks"] == [K, "auto"]
    assert {"platform", "cpus", "torch_threads", "device"} <= set(document["machine"])
    assert {"specdec", "torch", "transformers", "python"} <= set(document["versions"])
    for name in ("speedup.png", "acceptance_per_position.png", "mean_accepted_length_vs_k.png"):
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == len(document["records"]) and {"speedup_median", "speedup_spread", "noisy"} <= set(rows[0])


def test_records_cover_every_contender_and_category(bench_run):
    _, _, document = bench_run
    records = document["records"]
    labels = [r["contender"] for r in records if r["category"] == "all"]
    drafters = ["ngram", "draft-model", "medusa", "eagle", "mtp"]
    assert labels[0] == "plain" and {f"{d}:k={k}" for d in drafters for k in (K, "auto")} <= set(labels)
    assert {f"{d}+tree:k={k}" for d in drafters for k in (K, "auto")} <= set(labels)  # each drafter's tree row
    assert {"hf-plain", "hf-static", "hf-prompt-lookup", "hf-assisted"} <= set(labels)
    assert {r["category"] for r in records} == {"coding", "docs", "all"}
    for record in records:
        assert isinstance(record["noisy"], bool) and record["rounds"] == 2, record["contender"]
        for measure in MEASURES:
            assert set(record[measure]) == {"median", "spread", "rounds"}, (record["contender"], measure)


def test_figures_are_consistent_with_the_runs(bench_run):
    _, _, document = bench_run
    for r in document["records"]:
        mal = r["mean_accepted_length"]["median"]
        if r["contender"] in ("plain", "hf-plain"):
            assert mal == pytest.approx(1.0, abs=0.01), r["contender"]
        if r["drafter"] is not None:
            k = AUTO_MAX if r["k"] == "auto" else r["k"]
            assert 1.0 <= mal <= k + 1, r["contender"]
            assert 0.0 <= r["acceptance_rate"]["median"] <= 1.0  # accepted <= drafted
            assert all(v is None or 0 <= v <= 1 for v in r["acceptance_per_position"])
            assert r["same_as_plain"] is True, r["contender"]  # greedy: lossless
            assert r["ideal_speedup"]["median"] > 0 and 0 <= r["draft_share"]["median"] <= 1
            shares = r["draft_share"]["median"] + r["verify_share"]["median"]
            assert shares <= 1.0 + 1e-6
        assert r["new_tokens"] == NEW * r["runs"], r["contender"]
        assert r["speedup"]["median"] > 0
    trees = [r for r in document["records"] if r["tree"] and r["category"] == "all"]
    assert trees and all(r["contender"].endswith(("+tree:k=3", "+tree:k=auto")) for r in trees)
    for r in document["records"]:
        if r["drafter"] is not None:
            assert r["draft_size"]["median"] > 0 and r["verify_ms"]["median"] > 0, r["contender"]
    wide = [r for r in trees if r["k"] == K and r["drafter"] in ("eagle", "mtp", "draft-model", "medusa")]
    assert all(r["draft_size"]["median"] > K for r in wide)  # more nodes than a chain's k
    assert document["tree_forward_costs"]["eager"] and all(v > 0 for v in document["tree_forward_costs"]["eager"].values())
    assert list(document["forward_costs"]) == ["eager"] and document["compile_seconds"] > 0  # hf-static compiles
    auto = [r for r in document["records"] if r["k"] == "auto" and r["category"] == "all"]
    assert all(0 <= r["mean_draft_length"] <= AUTO_MAX for r in auto)  # 0 for the plain steps it chose
    plain = next(r for r in document["records"] if r["contender"] == "plain" and r["category"] == "all")
    assert plain["runs"] == 2 * 3  # repeats x turns; the warm-up round is not recorded
    assert document["rounds"] == 2 and document["settings"]["repeat_limit"] == 2  # --max-repeats 2: no extra round


@pytest.mark.usefixtures("strict_compile")
def test_both_engines_side_by_side_each_row_over_plain_on_its_own_engine(quick_zoo: Path, spec_bench_file: Path,
                                                                        tmp_path: Path):
    code = cli.main(["bench", "--quick", "--cache-dir", str(quick_zoo.parent), "--prompts", str(spec_bench_file),
                     "--drafter", "ngram", "--drafter", f"draft-model:model={quick_zoo / 'draft-model'}",
                     "--engine", "both", "--repeats", "1", "--warmup", "1", "--max-new-tokens", str(NEW),
                     "--no-peers", "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    document = json.loads((tmp_path / "results.json").read_text())
    records = {r["contender"]: r for r in document["records"] if r["category"] == "all"}
    assert list(records) == ["plain", "plain@compiled", "ngram", "ngram@compiled", "draft-model",
                             "draft-model@compiled"]
    assert set(document["forward_costs"]) == {"eager", "compiled"}
    for label, record in records.items():
        assert record["engine"] == ("compiled" if label.endswith("@compiled") else "eager")
        assert record["same_as_plain"] is True, label
    assert records["plain@compiled"]["speedup"]["median"] == pytest.approx(1.0)  # over itself
    assert records["plain"]["speedup_over_eager"]["median"] == pytest.approx(1.0)
    assert records["plain@compiled"]["compile_seconds"] > 0 and records["plain"]["compile_seconds"] == 0
    for label in ("ngram", "draft-model"):  # each compiled row is over compiled plain
        compiled, plain = records[f"{label}@compiled"], records["plain@compiled"]
        ratio = plain["tokens_per_second"]["median"] / compiled["tokens_per_second"]["median"]
        assert compiled["speedup"]["median"] == pytest.approx(1 / ratio, rel=0.35)
        assert compiled["ideal_speedup"]["median"] > 0


def test_turns_carry_the_previous_answer():
    turns = ("first question", "second question")
    assert turn_prompt(turns, [], 0) == "first question"
    assert turn_prompt(turns, [" answer one"], 1) == "first question answer one\n\nsecond question"


@pytest.mark.parametrize("line, message", [("not json", "is not JSON"), ('{"question_id": 1}', "'turns'"),
                                           ('{"turns": ["a"]}', "question_id"), ('[1, 2]', "not a JSON object")])
def test_bad_question_files_name_the_line(tmp_path: Path, line: str, message: str):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 0, "turns": ["ok"]}\n' + line + "\n")
    with pytest.raises(ValueError, match=message) as error:
        load_questions(path)
    assert f"{path}:2" in str(error.value) or "question_id" in message


def test_duplicate_question_ids_are_refused(tmp_path: Path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 1, "turns": ["a"]}\n{"question_id": 1, "turns": ["b"]}\n')
    with pytest.raises(ValueError, match="more than once"):
        load_questions(path)


def test_contenders_put_plain_first_and_honour_a_drafters_own_k():
    contenders = contenders_for([("ngram", {}), ("eagle", {"path": "x", "k": "auto"})], [2, 4], peers=False)
    assert [c.label for c in contenders] == ["plain", "ngram:k=2", "ngram:k=4", "eagle:k=auto"]
    assert contenders[3].options == {"path": "x"} and contenders[3].k == "auto"


def test_tree_rows_are_labelled_and_rows_sharing_a_label_show_their_options():
    contenders = contenders_for([("eagle", {"path": "x"}), ("eagle", {"path": "x", "tree": True}),
                                 ("ngram", {"branches": 4}), ("ngram", {"branches": 1}),
                                 ("eagle", {"path": "x", "tree": True, "top_k": 8})], [4], peers=False)
    assert [c.label for c in contenders] == ["plain", "eagle", "eagle+tree[tree=True]", "ngram+tree", "ngram",
                                             "eagle+tree[tree=True,top_k=8]"]
    assert [c.tree for c in contenders] == [False, False, True, True, False, True]


def test_adaptive_draft_length_follows_the_heuristic_and_stays_lossless(quick_zoo: Path):
    model = load_causal_lm(quick_zoo / "target", dtype=torch.float64)
    prompt = load_tokenizer(quick_zoo / "target")("def read(path):\n    ", add_special_tokens=False)["input_ids"]
    plain = specdec.generate(model, prompt, max_new_tokens=30).tokens
    drafter = AdaptiveDraftLength(specdec.make_drafter("ngram"), start=2)
    result = specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=8, max_new_tokens=30)
    assert result.tokens == plain
    asked = drafter.requested
    assert asked[0] == 2 and max(asked) <= 8 and len(set(asked)) > 1
    for step, (before, after) in enumerate(zip(asked, asked[1:])):
        proposed = drafter.history[step]
        if proposed == 0:
            assert after == before  # nothing drafted: nothing learned
        else:
            assert after in (min(8, before + 2), max(1, before - 1)) or after < before  # capped by the budget
    with pytest.raises(ValueError, match="starting draft length"):
        AdaptiveDraftLength(specdec.make_drafter("ngram"), start=0)


def test_adaptive_draft_length_adapts_a_trees_depth_and_keeps_draft_errors(quick_zoo: Path):
    model = load_causal_lm(quick_zoo / "target", dtype=torch.float64)
    prompt = load_tokenizer(quick_zoo / "target")("def read(path):\n    ", add_special_tokens=False)["input_ids"]
    plain = specdec.generate(model, prompt, max_new_tokens=30).tokens
    options = zoo.drafter_options(quick_zoo)["eagle"]
    drafter = AdaptiveDraftLength(specdec.make_drafter("eagle", **options, tree=True), start=2)
    result = specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=8, max_new_tokens=30)
    assert result.tokens == plain
    assert len(drafter.history) == len(drafter.requested) and len(set(drafter.requested)) > 1
    assert all(1 <= depth <= asked for depth, asked in zip(drafter.history, drafter.requested))  # depth <= k_t
    assert result.stats.drafted > sum(drafter.history)  # wider than deep

    class BrokenTree:
        name = "broken-tree"

        def propose(self, ctx, k):
            return Draft(ctx.tokens[:2].clone(), None, torch.tensor([0, -1]))

    with pytest.raises(DraftError, match=r"broken-tree.*parents\[0\] = 0"):
        specdec.generate(model, prompt, drafter=AdaptiveDraftLength(BrokenTree()), num_draft_tokens=4)


def test_medusa_choices_make_a_tree_row():
    assert drafts_trees("medusa", {"path": "x", "medusa_choices": "default"})
    assert drafts_trees("ngram", {"branches": 2}) and not drafts_trees("ngram", {"branches": 1})
    assert not drafts_trees("eagle", {"path": "x"}) and drafts_trees("eagle", {"path": "x", "tree": True})


def test_forward_costs_leave_the_cache_empty_and_are_positive(quick_zoo: Path):
    lm = specdec.CausalLM(load_causal_lm(quick_zoo / "target"))
    costs = forward_costs(lm, torch.arange(1, 20), [1, 5], repeats=2)
    assert set(costs) == {1, 5} and all(c > 0 for c in costs.values()) and lm.cache_length == 0
    assert ideal_speedup(2.0, 1.0, 1.0, 0.0) == 2.0 and ideal_speedup(3.0, 1.0, 1.5, 0.5) == 1.5


def test_bad_bench_arguments_are_one_line_errors(quick_zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    base = ["bench", "--quick", "--cache-dir", str(quick_zoo.parent), "--out", str(tmp_path), "--no-progress"]
    assert cli.main([*base, "--prompts", str(tmp_path / "none.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main([*base, "--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err
    assert cli.main([*base, "--drafter", "ngram:k=0"]) == 2
    assert "positive int or auto" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([*base, "--k", "zero"])


def test_on_the_zoo_the_bench_decodes_its_evaluation_with_intervals_ranks_and_loops(quick_zoo: Path, tmp_path: Path,
                                                                                    capsys):
    """Without --prompts the bench takes the family's evaluation prompts at its temperature, the
    same seeds per prompt: each chain's accepted length is the family's published figure, with
    its interval over prompts, a rank the intervals support and its part from loops."""
    figures = zoo.read_figures(quick_zoo)
    code = cli.main(["bench", "--quick", "--cache-dir", str(quick_zoo.parent), "--drafter", "ngram", "--drafter",
                     "eagle", "--drafter", "eagle3", "--prompts-per-category", "1", "--max-new-tokens",
                     str(figures["evaluation"]["new_tokens"]), "--repeats", "1", "--warmup", "0", "--no-peers",
                     "--engine", "eager", "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["settings"]["sampling"]["temperature"] == figures["evaluation"]["temperature"] == 0.5
    assert document["settings"]["verify_rules"] == [read_evaluation(quick_zoo).verify_rule] == ["token"]
    records = {r["contender"]: r for r in document["records"] if r["category"] == "all"}
    for name in ("ngram", "eagle", "eagle3"):
        record, published = records[name], figures["drafters"][name]
        assert record["mean_accepted_length_interval"] == published["mean_accepted_length"]
        assert record["per_prompt"]["new_tokens"] == [row[0] for row in published["prompts"]]
        assert record["from_loops"] == pytest.approx(published["from_loops"])
        low, high = record["speedup_interval"]["low"], record["speedup_interval"]["high"]
        assert 0 < low <= record["speedup_interval"]["estimate"] <= high
    from specdec.intervals import rank_labels, ranks

    drafted = {name: (records[name]["per_prompt"]["new_tokens"], records[name]["per_prompt"]["steps"])
               for name in ("ngram", "eagle", "eagle3")}
    assert {name: records[name]["rank"] for name in drafted} == rank_labels(ranks(drafted))
    assert records["plain"]["same_as_plain"] is None  # sampled: no token check
    table = capsys.readouterr().out
    assert "mean acc. len [95%]" in table and "question i seeded i" in table and "bootstrap interval" in table
    assert "rule token (docs/verification.md)" in table
