"""The example plugin package `examples/custom_drafter`: it installs with pip, registers its
drafter through the entry point, keeps greedy output exact, and its period finder is right."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "custom_drafter"
TESTS = Path(__file__).resolve().parent

# Run in a fresh interpreter that sees the installed example only through PYTHONPATH.
PARITY_SCRIPT = """
import json, specdec
from specdec import plugins
from tiny import tiny_model
registry = plugins.registry()
model = tiny_model("llama", vocab_size=48, seed=3, dtype=__import__("torch").float64)
prompt = [5, 9, 2, 5, 9, 2, 5, 9, 2, 7, 1, 7, 1]
plain = specdec.generate(model, prompt, max_new_tokens=40)
drafter = specdec.make_drafter("repeat", max_period=4, min_repeats=2)
spec = specdec.generate(model, prompt, drafter=drafter, num_draft_tokens=4, max_new_tokens=40)
print(json.dumps({"names": specdec.drafter_names(), "origin": registry.origins.get("repeat"),
                  "failures": [f.error for f in registry.failures], "plain": plain.tokens,
                  "spec": spec.tokens, "drafted": spec.stats.drafted, "module": type(drafter).__module__}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example installed with pip into a fresh target directory (built from a copy, so the
    source tree gets no build/ or egg-info)."""
    work = tmp_path_factory.mktemp("example")
    source = work / "source"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = work / "site"
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
               "--disable-pip-version-check", "--target", str(target), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"pip could not install the example (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return target


def test_installed_example_registers_repeat_and_keeps_greedy_output_exact(installed: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    env.pop("SPECDEC_DISABLE_PLUGINS", None)
    done = subprocess.run([sys.executable, "-c", PARITY_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=300, cwd=installed.parent)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failures"] == []
    assert "repeat" in result["names"] and {"ngram", "draft-model"} <= set(result["names"])
    assert result["origin"] == "repeat-drafter"
    assert result["module"].startswith("specdec_repeat_drafter")
    assert result["drafted"] > 0, "the periodic prompt must make the drafter propose something"
    assert result["spec"] == result["plain"]


# In-process checks of the drafter's logic, imported from the source tree.
@pytest.fixture(scope="module")
def example() -> object:
    sys.path.insert(0, str(EXAMPLE / "src"))
    try:
        import specdec_repeat_drafter
    finally:
        sys.path.remove(str(EXAMPLE / "src"))
    return specdec_repeat_drafter


def _propose(module: object, tokens: list[int], k: int, **options: object) -> list[int]:
    from specdec import DraftContext, Sampling

    drafter = module.RepeatDrafter(**options)
    ids = torch.tensor(tokens, dtype=torch.long)
    ctx = DraftContext(ids, Sampling(), torch.Generator(), target=None, vocab_size=100)
    draft = drafter.propose({0: ctx}, {0: k})[0]
    assert draft.probs is None and draft.tokens.dtype == torch.long and draft.tokens.dim() == 1
    return draft.tokens.tolist()


def _primitive(pattern: list[int]) -> bool:
    """True unless pattern is a shorter block repeated."""
    p = len(pattern)
    return all(pattern != pattern[:d] * (p // d) for d in range(1, p) if p % d == 0)


@given(pattern=st.lists(st.integers(0, 20), min_size=1, max_size=6).filter(_primitive),
       repeats=st.integers(2, 5), k=st.integers(1, 12))
def test_repeated_pattern_is_continued_for_k_tokens(example: object, pattern: list[int], repeats: int,
                                                    k: int) -> None:
    expected = (pattern * (k // len(pattern) + 1))[:k]
    assert _propose(example, pattern * repeats, k, max_period=6, min_repeats=2) == expected


@given(tokens=st.lists(st.integers(0, 1000), min_size=1, max_size=40, unique=True), k=st.integers(1, 8))
def test_context_without_repeats_gives_an_empty_draft(example: object, tokens: list[int], k: int) -> None:
    assert _propose(example, tokens, k) == []


@given(prefix=st.lists(st.integers(0, 5), max_size=20), pattern=st.lists(st.integers(0, 5), min_size=1, max_size=4),
       repeats=st.integers(1, 4), k=st.integers(1, 6))
def test_any_draft_extends_a_period_seen_min_repeats_times(example: object, prefix: list[int], pattern: list[int],
                                                           repeats: int, k: int) -> None:
    tokens = prefix + pattern * repeats
    draft = _propose(example, tokens, k, max_period=4, min_repeats=2)
    assert len(draft) in (0, k)
    if draft:
        full = tokens + draft
        assert any(len(tokens) >= 2 * p and all(full[i] == full[i - p] for i in range(len(full) - k - p, len(full)))
                   for p in range(1, 5)), f"{draft} continues no period of {tokens}"


def test_longest_run_wins_over_a_short_recent_repeat(example: object) -> None:
    # "2 1 1" twice: period 1 repeats only "1 1", period 3 covers all six tokens.
    assert _propose(example, [2, 1, 1, 2, 1, 1], 4) == [2, 1, 1, 2]


def test_min_repeats_and_max_period_limit_drafting(example: object) -> None:
    assert _propose(example, [4, 5, 6, 4, 5, 6], 3, min_repeats=3) == []
    assert _propose(example, [4, 5, 6, 4, 5, 6, 4, 5, 6], 3, min_repeats=3) == [4, 5, 6]
    assert _propose(example, [4, 5, 6, 4, 5, 6], 3, max_period=2) == []


@pytest.mark.parametrize("options, bad", [
    ({"max_period": 0}, "max_period"), ({"max_period": 2.5}, "max_period"), ({"max_period": True}, "max_period"),
    ({"min_repeats": 1}, "min_repeats"), ({"min_repeats": "2"}, "min_repeats"),
])
def test_invalid_options_are_rejected_by_name(example: object, options: dict[str, object], bad: str) -> None:
    with pytest.raises(ValueError, match=bad) as raised:
        example.RepeatDrafter(**options)
    assert repr(next(iter(options.values()))) in str(raised.value)
