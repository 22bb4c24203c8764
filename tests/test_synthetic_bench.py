"""The synthetic-target bench (`make bench-gpu` runs its "gpu" setting) in its tiny CPU setting:
every measure is written, and speculative rows reproduce plain greedy decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.bench import synthetic


@pytest.mark.usefixtures("strict_compile")
def test_the_tiny_setting_measures_every_row(tmp_path: Path) -> None:
    assert synthetic.main(["--setting", "tiny", "--device", "cpu", "--out", str(tmp_path)]) == 0
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["schema"] == synthetic.SCHEMA and document["copy_bandwidth"] > 0
    [target] = document["targets"]
    setting = synthetic.SETTINGS["tiny"]
    for engine in setting.engines:
        costs = target["forward_costs"][engine]
        assert all(costs[key] > 0 for key in ("T(1)", f"T({setting.k + 1})", "tree T(17)"))
    rows = {(r["contender"], r["engine"]): r for r in target["rows"]}
    expected = {(name, engine) for name in ("plain", *setting.drafters) for engine in setting.engines}
    assert expected | {("hf-plain", "transformers"), ("hf-static", "transformers")} == set(rows)
    for (name, engine), row in rows.items():
        assert row["tokens_per_second"] > 0 and 1.0 <= row["mean_accepted_length"] <= setting.k + 1
        if name == "plain" or engine == "transformers":
            assert 0 < row["bandwidth_share"] <= 1.0, (name, engine)
        if name != "plain":
            assert row["same_as_plain"] is True, (name, engine)  # greedy: every row is plain decoding
        if name not in ("plain", "hf-plain", "hf-static"):
            assert row["speedup"] > 0 and row["ideal_speedup"] > 0
    assert rows[("plain", "compiled")]["compile_seconds"] >= 0
    assert "| tiny | eagle+tree | compiled |" in (tmp_path / "table.md").read_text()
    curve = {(r["contender"], r["batch"]): r for r in target["batch"]["records"]}
    assert set(curve) == {(name, b) for name in ("plain", "ngram", "hf-batched") for b in setting.batches}
    assert all(r["same_as_plain"] for r in curve.values() if r["peer"] is None)
    assert "stops paying at" in (tmp_path / "table.md").read_text()
