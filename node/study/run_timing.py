"""What a study's run cost, over all its segments: a run stopped and resumed is timed as the sum
of the segments that made its rows, so a resumed study reports the CPU it spent, not the CPU of
its last sitting. Rounds redone after a crash count once: the time of those lost with it is not
in the checkpoint the run resumed from."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict


class RunTiming(BaseModel):
    """Seconds and CPU seconds of a run's set-ups (building and loading its nodes) and rounds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    setup_seconds: float = 0.0
    setup_cpu: float = 0.0
    round_seconds: float = 0.0
    round_cpu: float = 0.0
    rounds: int = 0  # rounds timed; fewer than the run's when it resumed from an untimed checkpoint
    segments: int = 0

    def plus(self, other: RunTiming) -> RunTiming:
        return RunTiming(**{name: getattr(self, name) + getattr(other, name) for name in RunTiming.model_fields})

    def report(self, nodes: int) -> dict[str, float | int]:
        """run.json's timings (their keys predate segments): CPU time too, because on a shared
        machine it predicts an uncontended run better than wall time."""
        node_rounds = max(1, self.rounds) * nodes
        return {
            "setup": self.setup_seconds,
            "total": self.setup_seconds + self.round_seconds,
            "per_node_round": self.round_seconds / node_rounds,
            "cpu_per_node_round": self.round_cpu / node_rounds,
            "rounds_timed": self.rounds,
            "segments": self.segments,
        }


class SegmentClock:
    """Times one segment of a run: from its start, through its set-up, to each round done."""

    def __init__(self) -> None:
        self.started, self.cpu_started = time.perf_counter(), time.process_time()
        self.setup = (0.0, 0.0)

    def set_up(self) -> None:
        """The set-up is done: the time so far is its."""
        self.setup = (time.perf_counter() - self.started, time.process_time() - self.cpu_started)

    def so_far(self, rounds: int) -> RunTiming:
        """This segment's timing after its set-up and `rounds` rounds."""
        seconds, cpu = time.perf_counter() - self.started, time.process_time() - self.cpu_started
        setup_seconds, setup_cpu = self.setup
        return RunTiming(
            setup_seconds=setup_seconds,
            setup_cpu=setup_cpu,
            round_seconds=seconds - setup_seconds,
            round_cpu=cpu - setup_cpu,
            rounds=rounds,
            segments=1,
        )


def cpu_hours(runs: dict[str, dict[str, Any]], config: str, seeds: int, nodes: int, rounds: int) -> float | None:
    """A config's CPU hours over its seeds' rounds (set-ups left out), from run.json's timings as
    the study's summary keeps them ("<config> seed <s>"). A run's untimed rounds (it resumed from
    a checkpoint written before runs were timed across segments) count at its timed rate. None
    when a run has no CPU timing (over libp2p each node is its own process)."""
    total = 0.0
    for seed in range(seeds):
        times = runs.get(f"{config} seed {seed}") or {}
        if times.get("cpu_per_node_round") is None:
            return None
        total += times["cpu_per_node_round"] * nodes * rounds
    return total / 3600
