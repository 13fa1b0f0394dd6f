"""bench/study_start.py evaluates a study's run before its first update, built from the study's
own flags: a row per node, and nodes on one shared base start as one model."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
FLAGS = ["--model", "tiny", "--nodes", "3", "--configs", "4/4", "--tasks", "basic_arithmetic", "--torch-threads", "1"]
SHARED_BASE = ["--shared-base", "--lora", "--lora-rank", "4", "--generation-precision", "fp32", "--eval-questions", "6"]


def study_start(*args: str) -> subprocess.CompletedProcess:
    # By its path, not `-m bench.study_start`: bench/smollm2_decisive.sh, a running pre-registered
    # study, runs it so, and this keeps that command line working.
    return subprocess.run(
        [sys.executable, str(BENCH / "study_start.py"), *args], capture_output=True, text=True, timeout=300
    )


def test_every_node_of_a_shared_base_study_starts_as_the_base_model(tmp_path):
    rows_file = tmp_path / "rows.jsonl"
    done = study_start(*FLAGS, *SHARED_BASE, "--eval-every", "5", "--json", str(rows_file))
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert (row["config"], row["round"], row["questions_per_task"]) == ("4/4", 0, 6)
    assert len(row["heldout"]) == 3 and row["heldout"][0].keys() == {"basic_arithmetic"}
    assert row["heldout"][0] == row["heldout"][1] == row["heldout"][2]  # adapters start at zero
    assert done.stdout.count("node ") == 3 and "--eval-every 5" in row["command"]


def test_a_study_without_held_out_questions_is_refused_before_any_model_loads():
    done = study_start(*FLAGS, "--eval-every", "0")
    assert done.returncode == 2 and "--eval-every is 0" in done.stderr
    done = study_start(*FLAGS, "--shared-base", "--eval-every", "5")  # the study's own check
    assert done.returncode == 2 and "add --lora" in done.stderr
