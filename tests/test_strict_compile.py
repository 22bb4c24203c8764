"""`strict_compile` (tests/conftest.py): a test that asks for the compiled engine fails when a step ran
eagerly instead, whether the fallback happens in its own call, was remembered from an earlier one,
or was caught by the test; a test parametrized by `compile` is strict only where it compiles."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

# The inner tests plant a compile failure: torch.compile hands back a function that raises, on
# fresh tables of compiled and failed steps (the process's own stay as they were).
PLANTED = '''
import pytest
import torch

from specdec.runtime import engine


@pytest.fixture
def planted(monkeypatch):
    def broken(fn, **options):
        def run(*args):
            raise RuntimeError("planted: inductor cannot compile this")
        return run

    monkeypatch.setattr(engine, "_COMPILED", {})
    monkeypatch.setattr(engine, "_FAILED", {})
    monkeypatch.setattr(torch, "compile", broken)


def double(module, x):
    return module(x) * 2


def step(enabled=True):
    return engine.Step(double, "the planted step", enabled, torch.nn.Linear(3, 3))
'''


@pytest.fixture(scope="module")
def imported() -> None:
    """What the inner tests import, imported here first: pytester drops the modules an inner run
    imported when it ends, and torch's and transformers' do not import twice in one process."""
    import specdec
    from tiny import tiny_model

    specdec.generate(tiny_model("llama", vocab_size=32, seed=0), [1, 2, 3], drafter="ngram", max_new_tokens=2)


def _run(pytester: pytest.Pytester, body: str) -> pytest.RunResult:
    """The inner tests, with PLANTED, run by pytest in this process with tests/conftest.py as a plugin."""
    pytester.makepyfile(test_inner=PLANTED + body)
    return pytester.runpytest_inprocess("-p", "conftest", "-p", "no:cacheprovider", "-q")


def test_a_compiled_test_fails_when_a_step_falls_back_to_eager_and_only_under_the_fixture(
        pytester: pytest.Pytester, imported: None) -> None:
    result = _run(pytester, '''
import specdec
from tiny import tiny_model


def _decode():
    model = tiny_model("llama", vocab_size=32, seed=0)
    return specdec.generate(model, [1, 2, 3], drafter="ngram", max_new_tokens=6, compile=True).tokens


def test_compiled_equals_eager(planted, strict_compile):
    assert _decode() == specdec.generate(tiny_model("llama", vocab_size=32, seed=0), [1, 2, 3], drafter="ngram",
                                         max_new_tokens=6).tokens


def test_the_fallback_itself(planted):
    with pytest.warns(engine.CompileFallbackWarning, match="planted"):
        _decode()
''')
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["E *.CompileFallbackWarning: specdec: cannot compile the LlamaForCausalLM forward "
                                 "(RuntimeError: planted*", "FAILED test_inner.py::test_compiled_equals_eager*"])


def test_a_step_remembered_as_failed_fails_a_strict_test_before_it_runs(pytester: pytest.Pytester,
                                                                        imported: None) -> None:
    result = _run(pytester, '''
@pytest.fixture
def earlier(planted):
    engine._FAILED[("the planted step", "Linear")] = "RuntimeError: an earlier test's"


def test_strict(earlier, strict_compile):
    step()
''')
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*CompileFallbackWarning*an earlier test's*SPECDEC_STRICT_COMPILE is set*"])


def test_a_fallback_the_test_swallowed_fails_it_at_teardown(pytester: pytest.Pytester, imported: None) -> None:
    result = _run(pytester, '''
def test_strict(planted, strict_compile):
    try:
        step()(torch.ones(2, 3))
    except engine.CompileFallbackWarning:
        pass
''')
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_strict*", "*did not compile*the planted step*planted*"])


def test_a_test_parametrized_by_compile_is_strict_where_it_compiles(pytester: pytest.Pytester, imported: None) -> None:
    result = _run(pytester, '''
@pytest.mark.parametrize("compile", [False, True])
def test_steps(planted, compile):
    step(compile)(torch.ones(2, 3))
''')
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*FAILED*test_steps?True?*"])
