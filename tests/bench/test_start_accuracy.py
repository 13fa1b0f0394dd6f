"""bench/start_accuracy.py still runs: its --smoke mode scores a tiny model on two tasks."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_start_accuracy_smoke_prints_and_writes_one_row_per_task(tmp_path):
    rows_file = tmp_path / "rows.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.start_accuracy",
            "--smoke",
            "--models-dir",
            str(tmp_path / "models"),
            "--json",
            str(rows_file),
            "--task-config",
            '{"basic_arithmetic": {"max_digits": 2}}',
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "start accuracy of tiny at the easy settings with" in done.stdout
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert [r["task"] for r in rows] == ["basic_arithmetic", "bf"]
    assert rows[0]["config"]["max_digits"] == 2 and rows[0]["groups"] == 1  # the config laid over the easy one
    assert all(0 <= r["greedy"] <= 1 and 0 <= r["sampled"] <= 1 and r["tokens"] > 0 for r in rows)
