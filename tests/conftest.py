"""Shared fixtures: one models cache per test session, and the processes a test starts, killed
afterwards. Shared helpers are in tests/support/."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_models_dir(tmp_path_factory) -> Path:
    """One models cache for the whole session, so SmolLM2 is converted from GGUF once."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def screen_policy(tmp_path_factory):
    """The tiny policy warm-started for 150 steps on basic_arithmetic, so that the screen's bar,
    drawn from its own completions, refuses injected text. One warm start for the session: the
    screen's tests (tests/training/test_typicality.py, tests/screen_attacks/) only measure with
    it and never train it."""
    import torch

    from sapo.training.learning.warmstart import WarmStartSettings, warm_start
    from sapo.training.models.policy import load_policy
    from sapo.training.problems.tasks import default_task_specs

    torch.set_num_threads(1)
    policy = load_policy("tiny", device="cpu", seed=0, models_dir=tmp_path_factory.mktemp("models"))
    warm_start(policy, default_task_specs(["basic_arithmetic"]), WarmStartSettings(steps=150))
    return policy


@pytest.fixture
def nodes():
    """Processes a test starts (tests.support.processes.NodeProcess or alike); killed afterwards."""
    started: list = []
    yield started
    for process in started:
        process.stop(signal.SIGKILL)
