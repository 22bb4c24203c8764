"""Every example in examples/ runs as written, on the quick zoo (demo.py: tests/test_demo.py;
the plugin package: tests/test_example_plugin.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ELSEWHERE = {"demo.py"}  # run by tests/test_demo.py


def _tiny_target(directory: Path) -> Path:
    """A tiny Llama on a metaspace tokenizer of its own (another vocabulary than the zoo's)."""
    from tiny import tiny_model
    from tokenizers_for_tests import metaspace_tokenizer

    tokenizer = metaspace_tokenizer(directory)
    tiny_model("llama", vocab_size=len(tokenizer), seed=0).save_pretrained(directory)
    return directory


def _arguments(name: str, cache: str, tmp_path: Path) -> list[str]:
    quick = ["--quick", "--cache-dir", cache]
    if name == "cross_family.py":
        return ["--target", str(_tiny_target(tmp_path / "target")), *quick, "--prompts", "1", "--new-tokens", "6",
                "--temperature", "0", "0.8", "--rows", "draft-model tli", "draft-model slem"]
    return {
        "compare_with_transformers.py": [*quick, "--repeats", "1", "--new-tokens", "8", "--device", "cpu"],
        "trace_a_run.py": [*quick, "--new-tokens", "8", "--out", str(tmp_path / "trace.html")],
        "verify_probe.py": quick,
        "train_a_drafter.py": [*quick, "--steps", "2", "--out", str(tmp_path)],
        "structured_output.py": [*quick, "--drafter", "ngram", "--drafter", "suffix", "--max-new-tokens", "12",
                                 "--repeats", "1", "--warmup", "0", "--eager", "--out", str(tmp_path)],
        "sampling_cost.py": ["--tokenizer", str(Path(cache).glob("quick-*/tokenizer").__next__()), "--vocab",
                             "--repeats", "2"],
        "rule_gain.py": [*quick, "--temperature", "1.0", "--prompts-per-category", "1", "--new-tokens", "8",
                         "--rows", "eagle sampled", "draft-model+tree without_replacement"],
        "verify_rule_cost.py": ["--vocab", "64", "--repeats", "2", "--nodes", "6"],
        "packed_weights.py": [*quick, "--new-tokens", "1", "--repeats", "1", "--quantize", "int8"],
        "auto_draft_length.py": [*quick, "--prompts", "1", "--new-tokens", "4", "--repeats", "1"],
        "dflash_width.py": [*quick, "--steps", "2", "--heads", "2"],
        "ddtree_curve.py": [*quick, "--budgets", "4", "--prompts-per-category", "1", "--new-tokens", "8"],
        "grammar_engines.py": ["--tokenizer", str(Path(cache).glob("quick-*/tokenizer").__next__()), "--repeats", "1"],
    }[name]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", sorted(p for p in EXAMPLES.glob("*.py") if p.name not in ELSEWHERE),
                         ids=lambda p: p.name)
def test_example_runs(path: Path, quick_zoo: Path, tmp_path: Path):
    module = _load(path)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = module.main(_arguments(path.name, str(quick_zoo.parent), tmp_path))
    assert code in (0, None), buffer.getvalue()
    assert buffer.getvalue().strip()
