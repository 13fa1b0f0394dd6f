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


@pytest.fixture
def nodes():
    """Processes a test starts (tests.support.processes.NodeProcess or alike); killed afterwards."""
    started: list = []
    yield started
    for process in started:
        process.stop(signal.SIGKILL)
