"""What the peer adapters share with bench/round.py: the job file, scoring, RSS, the result line.

Standard library only: this module is imported by the project's venv (bench/round.py) and by
each peer's own venv (bench/peers/<name>), which has neither `sapo` nor reasoning_gym.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

RESULT_MARKER = "PEER_ROUND_RESULT "

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(completion: str) -> str | None:
    """The last complete <answer>...</answer> block, stripped (as sapo.training.problems.rewards does)."""
    matches = _ANSWER.findall(completion)
    return matches[-1].strip() if matches else None


def score(completion: str, oracle: str) -> float:
    """ReasoningGYM's default `score_answer`, which basic_arithmetic uses: 1 for an exact answer,
    len(oracle)/len(answer) when the oracle is inside a longer answer, else 0. Copied so that the
    peer venvs need not install reasoning_gym; the project scores with the real one."""
    answer = extract_answer(completion)
    if not answer:
        return 0.0
    if answer == oracle:
        return 1.0
    return len(oracle) / len(answer) if oracle in answer else 0.0


def force_signal(rewards: list[float]) -> list[float]:
    """bench/round.py's --force-signal: a group whose rewards are all equal gets alternating 0/1,
    so that every framework pays for a full update on every group."""
    return rewards if len(set(rewards)) > 1 else [float(i % 2) for i in range(len(rewards))]


def peak_rss_mb() -> float:
    """Peak RSS since the last `reset_peak_rss` (Linux VmHWM), else since process start."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> bool:
    """Linux lets a process reset its own VmHWM; then the round's peak excludes loading."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def read_job(argv: list[str]) -> dict:
    """The job bench/round.py wrote: `adapter.py JOB.json`."""
    if len(argv) != 2:
        raise SystemExit(f"usage: {Path(argv[0]).name} JOB.json (written by bench/round.py)")
    return json.loads(Path(argv[1]).read_text())


def emit(result: dict) -> None:
    print(RESULT_MARKER + json.dumps(result), flush=True)


def log(framework: str, message: str) -> None:
    print(f"  [{framework}] {message}", file=sys.stderr, flush=True)


STEPS = ("generate", "score", "update")
TIMES = tuple(f"{step}_{kind}" for step in (*STEPS, "total") for kind in ("s", "cpu_s"))


def summarize(rounds: list[dict]) -> dict:
    """Means over the timed rounds: all but the first (a warm-up) when there are several."""
    timed = rounds[1:] if len(rounds) > 1 else rounds
    mean = {k: sum(r[k] for r in timed) / len(timed) for k in (*TIMES, "tokens", "real_reward_mean")}
    mean["tokens_per_s"] = mean["tokens"] / mean["generate_s"] if mean["generate_s"] > 0 else 0.0
    mean["tokens_per_cpu_s"] = mean["tokens"] / mean["generate_cpu_s"] if mean["generate_cpu_s"] > 0 else 0.0
    return {"timed_rounds": len(timed), **mean, "rounds": rounds}


class Clock:
    """Wall and CPU seconds (this process, all its threads) of each step of one round.

    CPU time is what the round would take alone on a quiet core when it runs one thread; on a
    shared machine it is the steadier figure of the two.
    """

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def lap(self, step: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.laps[f"{step}_s"] = wall - self._wall
        self.laps[f"{step}_cpu_s"] = cpu - self._cpu
        self._wall, self._cpu = wall, cpu

    def summary(self) -> str:
        """One progress line's worth: each step's wall seconds, with its CPU seconds."""
        return ", ".join(f"{s} {self.laps[f'{s}_s']:.2f}s (CPU {self.laps[f'{s}_cpu_s']:.2f}s)" for s in STEPS)

    def times(self) -> dict[str, float]:
        """generate/score/update and their total, wall and CPU."""
        total = {
            "total_s": sum(self.laps[f"{s}_s"] for s in STEPS),
            "total_cpu_s": sum(self.laps[f"{s}_cpu_s"] for s in STEPS),
        }
        return {**self.laps, **total}


def trainable_snapshot(model) -> float:
    # A cheap fingerprint of the trainable weights: an update that changes nothing is a broken update.
    import torch

    with torch.no_grad():
        return float(sum(p.double().square().sum() for p in model.parameters() if p.requires_grad))


# genrl's alone, but here so that the tests check it without a genrl venv
def one_update_step(fields, job: dict) -> dict:
    """The config options for one Adam step on all Q x G sequences, in either version's terms."""
    names = {f.name for f in fields}
    if "num_iterations" in names:  # 0.1.11
        return {"num_iterations": 1}
    if {"ppo_epochs", "minibatch_size"} <= names:  # 0.3.0
        return {"ppo_epochs": 1, "minibatch_size": len(job["batches"][0]["prompts"]) * job["generations"]}
    raise SystemExit(
        f"this genrl's GRPOTrainerConfig has neither num_iterations nor ppo_epochs/minibatch_size: {sorted(names)}"
    )
