"""Shared test settings: a derandomized hypothesis profile for CI, tiny-model fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))  # for `tests/tiny.py` and strategies

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=100,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

import torch  # noqa: E402

# Tiny models run fastest on one thread; more threads only contend on small CI machines.
torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def quick_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quick zoo family, built once per session into a temporary cache directory."""
    from specdec import zoo

    return zoo.build(zoo.QUICK, root=tmp_path_factory.mktemp("zoo-cache"), show_progress=False,
                     log=lambda line: None)


@pytest.fixture(scope="session")
def play_zoo(quick_zoo: Path) -> Path:
    """The zoo `specdec play` serves in the tests: the quick one, or with SPECDEC_PLAY_ZOO=full the
    default (full) zoo from the user's cache, as the screenshots in docs/learn.md are taken."""
    if os.environ.get("SPECDEC_PLAY_ZOO", "quick") == "full":
        from specdec import zoo

        return zoo.build(zoo.FULL)
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
