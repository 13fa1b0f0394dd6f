"""Resumable studies: a run stopped or crashed after a checkpoint goes on to exactly the rows of a
run that never stopped; a finished run is not run again; other settings are refused."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from sapo.node.cli import main
from sapo.node.study import runs
from sapo.node.study.nodes import RUN_STATE

STUDY = [
    "experiment",
    "--nodes",
    "2",
    "--configs",
    "4/4",  # external groups matter
    "--rounds",
    "5",
    "--seeds",
    "1",
    "--scripted-solvers",
    "1",  # right half the time: groups with signal, so the nodes train on external groups
    "--run-checkpoint-every",
    "2",
    "--no-progress",
    "--jobs",
    "1",
    # node settings, passed through; standing is on (the default)
    "--tasks",
    "basic_arithmetic",
    "--max-new-tokens",
    "6",
    "--generations",
    "4",
    # groups stay eligible for two rounds, so the inbox and its authors' standing carry over
    "--inbox-max-age-seconds",
    "2500",
    # the untrained model's groups all score 0: kept only by a node that adds its own completions
    "--augment-external",
    "1",
]
TINY = ["--warm-start-steps", "0"]
SHARED_BASE = ["--shared-base", "--model", "tiny", "--lora", "--lora-rank", "4", "--generation-precision", "fp32"]
SHARED_BASE += ["--lr", "1e-2"]
# Wall-clock timings: how long a round took on this machine just now, never the same twice.
TIMINGS = {"generate_seconds", "train_seconds", "round_seconds"}
# In a node's own round records (metrics.jsonl) also when it was written, and rates and screen
# times measured by the same clocks.
RECORD_TIMINGS = TIMINGS | {"time", "tokens_per_second", "screen_seconds"}


def _study(out: Path, node_flags: list[str]) -> list[str]:
    return [*STUDY, *node_flags, "--out", str(out)]


def _rows(path: Path, exclude: set[str]) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in exclude} for row in rows]


def _run_dir(out: Path) -> Path:
    return out / "runs" / "4-4" / "seed-0"


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("never-stopped")
    assert main(_study(out, TINY)) == 0
    return out


def _interrupt_at(monkeypatch, round_index: int, interrupt) -> None:
    """Call `interrupt` when the run writes node 0's row of `round_index` (after that round)."""
    row_of = runs.round_row

    def round_row(config, seed, node, model, record):
        if record.round == round_index and node == 0:
            interrupt()
        return row_of(config, seed, node, model, record)

    monkeypatch.setattr(runs, "round_row", round_row)


def _assert_same_run(a: Path, b: Path) -> None:
    rows = _rows(a / "raw.jsonl", TIMINGS)
    assert rows == _rows(b / "raw.jsonl", TIMINGS)
    assert any(row["loss"] is not None and row["external_groups"] for row in rows)  # external groups trained
    for node in ("node-0", "node-1"):
        records = _rows(_run_dir(a) / node / "metrics.jsonl", RECORD_TIMINGS)
        assert records == _rows(_run_dir(b) / node / "metrics.jsonl", RECORD_TIMINGS)


def test_a_crashed_run_resumes_to_the_same_rows(never_stopped, tmp_path, monkeypatch):
    # round 4 crashes after the checkpoint of round 2 and round 3's rows: those are cut and redone
    out = tmp_path / "crashed"

    def crash():
        raise RuntimeError("the machine went away")

    _interrupt_at(monkeypatch, 4, crash)
    with pytest.raises(RuntimeError, match="went away"):
        main(_study(out, TINY))
    assert json.loads((_run_dir(out) / RUN_STATE).read_text())["round"] == 2
    assert max(row["round"] for row in _rows(_run_dir(out) / "raw.jsonl", set())) == 3
    monkeypatch.undo()
    assert main(_study(out, TINY)) == 0
    _assert_same_run(never_stopped, out)
    assert not (_run_dir(out) / RUN_STATE).exists() and not (_run_dir(out) / "node-0" / "checkpoints").exists()
    # timed over both segments: rounds 1-2 before the crash (round 3's time went with it), 3-5 after
    _assert_timed_over(out, segments=2)


def _assert_timed_over(out: Path, segments: int) -> None:
    timing = json.loads((_run_dir(out) / runs.RUN_FINISHED).read_text())
    assert (timing["rounds_timed"], timing["segments"]) == (5, segments)
    assert timing["total"] > timing["setup"] > 0 and timing["cpu_per_node_round"] > 0


def test_a_stopped_run_checkpoints_its_round_and_resumes_to_the_same_rows(never_stopped, tmp_path, monkeypatch):
    # Ctrl-C during round 3 (no checkpoint due): the round finishes, the run checkpoints it and stops
    out = tmp_path / "stopped"
    _interrupt_at(monkeypatch, 3, lambda: signal.raise_signal(signal.SIGINT))
    assert main(_study(out, TINY)) == 130
    assert json.loads((_run_dir(out) / RUN_STATE).read_text())["round"] == 3
    assert not (out / "summary.json").exists()
    monkeypatch.undo()
    assert main(_study(out, TINY)) == 0
    _assert_same_run(never_stopped, out)
    _assert_timed_over(out, segments=2)


def test_a_finished_run_is_not_run_again(never_stopped, monkeypatch):
    raw = (_run_dir(never_stopped) / "raw.jsonl").read_text()
    _assert_timed_over(never_stopped, segments=1)

    def build_run(*args):
        raise AssertionError("a finished run was built again")

    monkeypatch.setattr(runs, "build_run", build_run)
    assert main(_study(never_stopped, TINY)) == 0
    assert (_run_dir(never_stopped) / "raw.jsonl").read_text() == raw
    assert len((never_stopped / "raw.jsonl").read_text().splitlines()) == 2 * 5


def test_other_settings_are_refused(never_stopped, capsys):
    assert main([*_study(never_stopped, TINY), "--rounds", "6", "--lr", "1e-3"]) == 2
    error = capsys.readouterr().err
    assert "--rounds: 5 before, 6 now" in error and "--lr:" in error and "--out" in error
    # what cannot change a row may differ
    assert main([*_study(never_stopped, TINY), "--run-checkpoint-every", "3", "--jobs", "2"]) == 0


@pytest.mark.parametrize(
    "node_flags",
    [
        pytest.param(SHARED_BASE, id="shared-base"),  # adapters and their optimizers on one base model
        pytest.param(["--nodes", "3", "--late-joiners", "1", "--join-round", "2", *TINY], id="late-joiner"),
    ],
)
def test_other_runs_resume_to_the_same_rows(node_flags, tmp_path, monkeypatch):
    never, crashed = tmp_path / "never", tmp_path / "crashed"
    assert main(_study(never, node_flags)) == 0

    def crash():
        raise RuntimeError("the machine went away")

    _interrupt_at(monkeypatch, 4, crash)
    with pytest.raises(RuntimeError, match="went away"):
        main(_study(crashed, node_flags))
    monkeypatch.undo()
    assert main(_study(crashed, node_flags)) == 0
    _assert_same_run(never, crashed)
