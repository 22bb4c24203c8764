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
