"""Shared test settings: a derandomized hypothesis profile for CI, how pytest-xdist hands the files
to the two workers, the count of graphs torch.compile built printed at the end, `strict_compile`
(a test of the compiled engine fails when a step ran eagerly instead), and the fixtures built once
per run (the quick zoo, its target and drafters, the play server and playground)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))  # for `tests/tiny.py` and strategies

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=100,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

import pytest  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """Where tests run (a pytest-xdist worker, or pytest without workers): one torch thread, since
    tiny models run fastest on one and more only contend on small CI machines. The controller of
    the workers runs no test and does not import torch, so that it starts them seconds sooner."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        import torch

        torch.set_num_threads(1)

# `make test` runs two pytest-xdist workers, one per core (docs/working.md). A worker takes a file at a
# time, so a file's module fixtures are built once; the files below are handed out first, longest
# first, so that neither worker is left with a long file at the end; the rest follow in collection order.
LONGEST = ("test_engine.py", "test_engine_zoo.py", "test_synthetic_bench.py", "test_distributed.py", "test_batch.py",
           "test_hybrid.py", "test_bench.py", "test_zoo_shipped.py", "test_play.py", "test_zoo.py",
           "test_lossless_statistical.py", "test_tree_loop.py", "test_hybrid_drafters.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist: the files of LONGEST first, in that order (sorting keeps each file's tests in
    their order). Without xdist the order stays."""
    if not (getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput")):
        return
    rank = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST)))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: pytest without it runs the suite in one process
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under `--dist loadfile`: pytest-xdist's file scheduling, with the files handed out in collection
    order (not, as by default, those with most tests first)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False
    return LoadFileScheduling(config, log)


# What the suite compiled: inductor's graphs built and those loaded from its on-disk cache, summed
# over the workers and printed at the end (docs/working.md: compare counts, not only seconds).
_COMPILED = pytest.StashKey[list[int]]()


def _inductor_counts() -> list[int]:
    """[graphs inductor built, graphs it loaded from its cache] in this process (none before dynamo is imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return [0, 0]
    counts = utils.counters["inductor"]
    return [int(counts["fxgraph_cache_miss"]), int(counts["fxgraph_cache_hit"])]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a pytest-xdist worker: hand its counts to the controller (`pytest_testnodedown`)."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["inductor_graphs"] = _inductor_counts()


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, on the controller
def pytest_testnodedown(node: object, error: object) -> None:
    counts = getattr(node, "workeroutput", {}).get("inductor_graphs", [0, 0])
    total = node.config.stash.setdefault(_COMPILED, [0, 0])  # type: ignore[attr-defined]
    total[0], total[1] = total[0] + counts[0], total[1] + counts[1]


def pytest_terminal_summary(terminalreporter: object, exitstatus: int, config: pytest.Config) -> None:
    built, loaded = config.stash.get(_COMPILED, None) or _inductor_counts()
    terminalreporter.write_line(  # type: ignore[attr-defined]
        f"torch.compile: inductor built {built} graphs and loaded {loaded} from its cache")


# A test that asks for the compiled engine must fail when a step fell back to eager: otherwise a test
# of "compiled equals eager" passes with every compile failing (specdec.runtime.engine.Step warns and
# runs the step eagerly). Tests of the fallback itself do not take the fixture.

_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Whether the test's call failed, for `strict_compile`'s teardown."""
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


@pytest.fixture
def strict_compile(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For a test of the compiled engine: a step that cannot compile, in this test or (as
    `specdec.runtime.engine` remembers) earlier in the process, raises CompileFallbackWarning
    where it would run eagerly, in this process and in the subprocesses the test starts
    (`SPECDEC_STRICT_COMPILE=1`); and a fallback the test caught and silenced fails it at
    teardown (unless it failed already)."""
    from specdec.runtime.engine import STRICT_ENV, compile_failures

    monkeypatch.setenv(STRICT_ENV, "1")
    before = compile_failures()
    yield
    new = {key: why for key, why in compile_failures().items() if key not in before}
    if new and not request.node.stash.get(_CALL_FAILED, False):
        pytest.fail(f"a compiled test ran steps eagerly: they did not compile: {new}", pytrace=False)


@pytest.fixture(autouse=True)
def _strict_where_compiled(request: pytest.FixtureRequest) -> None:
    """A test parametrized by `compile` takes `strict_compile` in its cases with compile=True."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("compile") is True:
        request.getfixturevalue("strict_compile")


def run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary directory of this test run that every pytest-xdist worker shares (the run's
    base directory; each worker's own lies inside it), or the session's own without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def quick_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quick zoo family, built once per test run into a temporary cache directory (the first
    worker to ask builds it under the family's lock; the others wait for it, then read it)."""
    from specdec import zoo

    return zoo.build(zoo.QUICK, root=run_directory(tmp_path_factory) / "zoo-cache", show_progress=False,
                     log=lambda line: None)


@pytest.fixture(scope="session")
def play_zoo(quick_zoo: Path) -> Path:
    """The zoo `specdec play` serves in the tests: the quick one, or with SPECDEC_PLAY_ZOO=full the
    default (full) zoo, the shipped one, as the screenshots in docs/learn.md are taken."""
    if os.environ.get("SPECDEC_PLAY_ZOO", "quick") == "full":
        from specdec import zoo

        return zoo.ready(zoo.FULL)
    return quick_zoo


@pytest.fixture(scope="session")
def play_server(play_zoo: Path, quick_zoo: Path, tmp_path_factory: pytest.TempPathFactory):
    """One `specdec play` on `play_zoo` for the session, with the test plugin installed."""
    from play_server import install_test_plugin, start_play

    plugin = install_test_plugin(tmp_path_factory.mktemp("play-plugin"))
    family = ["--quick"] if play_zoo == quick_zoo else []
    server = start_play([*family, "--cache-dir", str(play_zoo.parent)], plugin)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def quick_target(quick_zoo: Path):
    """The quick zoo's target (float32, eval), loaded once per run: the tests that decode it share its
    compiled graphs, which stay with the module (`specdec.runtime.engine`). Tests must not change it."""
    from specdec.checkpoints import load_causal_lm

    return load_causal_lm(quick_zoo / "target")


@pytest.fixture(scope="session")
def playground(quick_zoo: Path, quick_target):
    """A `specdec play` playground on the quick zoo's target, in this process (every drafter the zoo has)."""
    from play_server import PROMPT

    from specdec.checkpoints import load_tokenizer
    from specdec.play import Playground, drafter_choices
    from specdec.zoo import drafter_options

    tokenizer = load_tokenizer(quick_zoo / "target")
    return Playground(tokenizer, quick_target, drafter_choices(drafter_options(quick_zoo)), example=PROMPT)


@pytest.fixture(scope="session")
def zoo_drafter(quick_zoo: Path):
    """`zoo_drafter(name, compiled, **extra)`: the quick zoo's drafter `name` with the zoo's options and
    `extra` (e.g. its tree options), made once per run for eager and once for compiled decoding (a
    drafter's files are read once; fresh instances would share its graphs), and forgotten (`specdec.protocols.forget`)
    each time it is handed out, as a fresh instance would be."""
    from specdec import make_drafter, zoo
    from specdec.protocols import forget

    options = zoo.drafter_options(quick_zoo)
    made: dict[tuple, object] = {}

    def get(name: str, compiled: bool, **extra: object) -> object:
        key = (name, compiled, tuple(sorted(extra.items())))
        if key not in made:
            made[key] = make_drafter(name, **{**options[name], **extra})
        forget(made[key])
        return made[key]

    return get
