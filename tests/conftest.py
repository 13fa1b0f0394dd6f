"""Shared fixtures: real CLI processes on loopback, and one converted SmolLM2 per test session."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

LOOPBACK_LISTEN = "/ip4/127.0.0.1/tcp/0"

# Small, fast node settings for tests that exercise the daemon rather than learning; each test
# that picks its own address takes TINY, the rest FAST_TINY.
TINY = [
    "--model",
    "tiny",
    "--tasks",
    "basic_arithmetic",
    "--max-new-tokens",
    "24",
    "--generations",
    "4",
    "--warm-start-steps",
    "0",
    "--torch-threads",
    "1",
]
FAST_TINY = [*TINY, "--listen", LOOPBACK_LISTEN]


def sapo_node(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "sapo.node.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def read_metrics(data_dir: Path) -> list[dict]:
    path = data_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


def wait_for(predicate, timeout: float, interval: float = 0.5, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture(scope="session")
def shared_models_dir(tmp_path_factory) -> Path:
    """One models cache for the whole session, so SmolLM2 is converted from GGUF once."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture
def nodes():
    """Processes a test starts (tests.processes.NodeProcess or alike); killed afterwards."""
    started: list = []
    yield started
    for process in started:
        process.stop(signal.SIGKILL)
