"""The benchmark scripts still run: each one's --smoke mode exits 0 and prints its table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_script(name: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH / name), "--smoke", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_round_benchmark_smoke(tmp_path):
    done = run_script("round.py", "--models-dir", str(tmp_path / "models"), timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GRPO round benchmark" in done.stdout
    header = next(line for line in done.stdout.splitlines() if line.startswith("model "))
    for column in ("generate s", "score s", "enc+update s", "total s", "tok/s", "peak RSS MB (round)"):
        assert column in header, header
    row = next(line for line in done.stdout.splitlines() if line.startswith("tiny "))
    assert row.split()[-1] == "0", f"the smoke round's update was skipped: {row}"


def test_gossip_benchmark_smoke():
    done = run_script("gossip.py", timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "gossip benchmark: 3 nodes" in done.stdout
    for label in ("delivered / expected", "latency p50 / p99", "frame bytes per group", "CPU per message"):
        assert label in done.stdout, done.stdout
    delivered = next(line for line in done.stdout.splitlines() if line.startswith("delivered / expected"))
    assert not delivered.rstrip().endswith("= 0.0000"), f"nothing was delivered: {delivered}"
