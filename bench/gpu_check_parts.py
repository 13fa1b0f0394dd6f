"""The GPU check's parts (bench/gpu_check.py): each one's command, how it runs, and what it left.

A part is the product's own command line in a child process of its own, in its own process
group and with its own time budget; its reader turns the part's log and result rows into an
Outcome. The standard library alone: on the box, sapo exists only after prepare.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


@dataclass
class Budget:
    """Seconds a part may run before it is stopped (the study takes what is left instead)."""

    prepare: float
    tests: float
    round: float
    roofline: float
    shared: float
    study_min: float  # below this much time left, the study is skipped
    study_reserve: float  # kept back from the study's --max-minutes for its start, last round and summary


REAL = Budget(prepare=150, tests=100, round=80, roofline=90, shared=120, study_min=120, study_reserve=75)
REHEARSAL = Budget(prepare=60, tests=240, round=180, roofline=180, shared=240, study_min=45, study_reserve=40)


@dataclass
class Outcome:
    part: str
    status: str  # ok, failed, timeout, skipped
    seconds: float = 0.0
    headline: str = ""
    detail: str = ""  # the end of the part's output, or why it was skipped
    rows: list[dict] = field(default_factory=list)


@dataclass
class Setup:
    """Where the parts run: the interpreter, its environment, the model each part uses."""

    python: str
    env: dict[str, str]
    work: Path  # this run's files: logs, rows, the study; made afresh each run
    site: Path  # the bundle's packages (kept between runs on one machine)
    models_dir: Path
    model: str  # for round, roofline and shared
    study_model: str | None  # None: no real weights for a study
    notes: list[str] = field(default_factory=list)


# --- the parts' commands ------------------------------------------------------------------------


def tests_command(args, setup: Setup) -> list[str]:
    paths = args.tests.split(",")
    return [
        setup.python,
        "-m",
        "pytest",
        "-q",
        "-m",
        "cuda",
        "-p",
        "no:cacheprovider",
        "--continue-on-collection-errors",
        f"--junitxml={setup.work / 'tests.xml'}",
        *paths,
    ]


def round_command(args, setup: Setup) -> list[str]:
    sizes = (
        ["--questions", "2", "--generations", "4", "--max-new-tokens", "8", "--bandwidth-mb", "16"]
        if args.rehearsal
        else ["--questions", "4", "--generations", "8", "--max-new-tokens", "128"]
    )
    return [
        setup.python,
        "-m",
        "bench.round",
        "--models",
        setup.model,
        "--device",
        args.device,
        "--precision",
        "bf16",
        "--rounds",
        "2",
        "--peers",
        "none",
        "--hf-generate",
        "--models-dir",
        str(setup.models_dir),
        "--json",
        str(setup.work / "round.jsonl"),
        *sizes,
    ]


def roofline_command(args, setup: Setup) -> list[str]:
    sizes = (
        ["--batches", "4,8", "--steps", "4", "--matmul-seconds", "0.01", "--stream-mb", "2", "--bandwidth-mb", "16"]
        if args.rehearsal
        else [
            "--batches",
            "32,256",
            "--steps",
            "64",
            "--matmul-seconds",
            "0.05",
            "--stream-mb",
            "128",
            "--bandwidth-mb",
            "1024",
        ]
    )
    return [
        setup.python,
        "-m",
        "bench.roofline",
        "--model",
        setup.model,
        "--device",
        args.device,
        "--models-dir",
        str(setup.models_dir),
        "--json",
        str(setup.work / "roofline.jsonl"),
        *sizes,
    ]


def shared_command(args, setup: Setup) -> list[str]:
    sizes = (
        [
            "--nodes",
            "2",
            "--rounds",
            "1",
            "--questions",
            "2",
            "--generations",
            "4",
            "--max-new-tokens",
            "8",
            "--threads",
            "1",
            "--generation-precision",
            "fp32",
        ]
        if args.rehearsal
        else ["--nodes", "8", "--rounds", "2", "--questions", "4", "--generations", "8", "--max-new-tokens", "48"]
    )
    return [
        setup.python,
        "-m",
        "bench.shared_base",
        "--model",
        setup.model,
        "--device",
        args.device,
        "--models-dir",
        str(setup.models_dir),
        "--json",
        str(setup.work / "shared.jsonl"),
        *sizes,
    ]


def study_command(args, setup: Setup, minutes: float) -> list[str]:
    sizes = (
        [
            "--nodes",
            "2",
            "--configs",
            "2/0,1/1",
            "--rounds",
            "3",
            "--max-new-tokens",
            "8",
            "--generations",
            "4",
            "--jobs",
            "1",
        ]
        if args.rehearsal
        else ["--nodes", "8", "--configs", "8/0,4/4", "--rounds", "2000", "--max-new-tokens", "128", "--jobs", "2"]
    )
    return [
        setup.python,
        "-m",
        "sapo.node.cli",
        "experiment",
        "--model",
        setup.study_model,
        "--lora",
        "--shared-base",
        "--device",
        args.device,
        "--tasks",
        args.task,
        "--task-config",
        args.task_config,
        "--max-minutes",
        f"{minutes:.2f}",
        "--no-progress",
        "--models-dir",
        str(setup.models_dir),
        "--out",
        str(setup.work / "study"),
        *sizes,
    ]


# the study's command takes its minutes too: what is left when it starts
COMMANDS = {"tests": tests_command, "round": round_command, "roofline": roofline_command, "shared": shared_command}

# --- running a part -----------------------------------------------------------------------------


def run_logged(command: list[str], log: Path, timeout: float, env: dict[str, str]) -> tuple[str, float]:
    """Run `command` with its output in `log`; ('ok' | 'failed' | 'timeout', seconds). Its own
    process group, so that a part stopped for time takes its workers with it."""
    started = time.perf_counter()
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        child = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True
        )
        try:
            code = child.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            stop_group(child)
            out.write(f"\n[gpu_check] stopped after {timeout:.0f} s, the part's budget\n")
            return "timeout", time.perf_counter() - started
    return ("ok" if code == 0 else "failed"), time.perf_counter() - started


def stop_group(child: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return ""
    text = path.read_text(errors="replace").replace("\r", "\n")
    return "\n".join(line for line in text.splitlines()[-lines:])


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- reading each part's results ----------------------------------------------------------------


def tests_outcome(setup: Setup, status: str, seconds: float, log: Path) -> Outcome:
    rows = []
    report = setup.work / "tests.xml"
    if report.exists():
        for case in ElementTree.parse(report).iter("testcase"):
            outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
            message = next((child.get("message", "") for child in case if child.tag != "system-out"), "")
            rows.append(
                {
                    "test": f"{case.get('classname')}::{case.get('name')}",
                    "outcome": outcome,
                    "seconds": float(case.get("time", 0)),
                    "message": message[:500],
                }
            )
    counts = {o: sum(r["outcome"] == o for r in rows) for o in ("passed", "failure", "error", "skipped")}
    headline = ", ".join(f"{n} {o}" for o, n in counts.items() if n) or "no tests ran"
    # pytest exits 5 when every test was deselected; with all of them skipped it is 0
    return Outcome("tests", status, seconds, headline, tail(log, 30), rows)


def round_outcome(setup: Setup, status: str, seconds: float, log: Path) -> Outcome:
    rows = read_rows(setup.work / "round.jsonl")
    headline = ""
    for r in rows:
        hf = r.get("hf_generate") or {}
        headline = (
            f"{r['model']} round {r['total_s']:.2f} s (generate {r['generate_s']:.2f}, update {r['update_s']:.2f}); "
            f"generate {r['tokens_per_s']:.0f} tok/s"
        )
        if hf:
            headline += (
                f" vs plain HF generate {hf['tokens_per_s']:.0f} tok/s ({r['tokens_per_s'] / hf['tokens_per_s']:.2f}x)"
            )
        if r.get("gpu_peak_mb"):
            headline += f"; peak GPU {r['gpu_peak_mb']:.0f} MB"
    return Outcome("round", status, seconds, headline, tail(log, 30), rows)


def roofline_outcome(setup: Setup, status: str, seconds: float, log: Path) -> Outcome:
    rows = read_rows(setup.work / "roofline.jsonl")
    cells = []
    for r in rows:
        if "batch" not in r:
            continue
        roof = r.get("card_bf16_roof") or r["bf16_roof"]
        cells.append(
            f"B={r['batch']} bf16 {r['ours_bf16']:.0f} tok/s = {100 * r['ours_bf16'] / roof:.1f}% of "
            f"{'the card' if r.get('card_bf16_roof') else 'the'} roof ({roof:.0f})"
            + (f", HF {r['hf_generate']:.0f}" if r.get("hf_generate") else "")
        )
    return Outcome("roofline", status, seconds, "; ".join(cells), tail(log, 30), rows)


def shared_outcome(setup: Setup, status: str, seconds: float, log: Path) -> Outcome:
    rows = read_rows(setup.work / "shared.jsonl")
    mixed = next((r for r in rows if r["mode"] == "shared_mixed"), None)
    headline = ""
    if mixed:
        memory = mixed["gpu_vs_separate"] if mixed.get("peak_gpu_bytes") is not None else mixed["rss_vs_separate"]
        kind = "GPU memory" if mixed.get("peak_gpu_bytes") is not None else "RSS"
        met = mixed["speedup_vs_separate"] >= 3 and memory <= 0.25
        headline = (
            f"{mixed['nodes']} nodes, mixed batch: {mixed['speedup_vs_separate']:.2f}x the speed of separate "
            f"models in {memory:.2f} of their {kind} (goal >= 3x in <= 0.25: {'met' if met else 'NOT met'})"
        )
    return Outcome("shared", status, seconds, headline, tail(log, 30), rows)


def study_outcome(setup: Setup, status: str, seconds: float, log: Path) -> Outcome:
    folder = setup.work / "study"
    rows = read_rows(folder / "raw.jsonl")
    headline = ""
    summary_path = folder / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        cells = []
        for name, arm in summary["results"].items():
            cell = (
                f"{name}: accuracy {arm['accuracy_start']['mean']:.2f} -> {arm['accuracy_end']['mean']:.2f}, "
                f"cumulative {arm['cumulative_accuracy']['mean']:.2f}"
            )
            ratio = (arm.get("ratio_to_baseline") or {}).get("cumulative_accuracy")
            if ratio:
                cell += f" ({ratio['mean']:.3f}x {arm['ratio_to_baseline']['reference']})"
            cells.append(cell)
        headline = f"{summary['rounds_compared']} rounds compared; " + "; ".join(cells)
    return Outcome("study", status, seconds, headline, tail(log, 30), rows)


READERS = {
    "tests": tests_outcome,
    "round": round_outcome,
    "roofline": roofline_outcome,
    "shared": shared_outcome,
    "study": study_outcome,
}
