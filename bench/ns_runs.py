"""Running a bench's OS processes in the network namespaces bench/wild_net.py builds, and what
every such run records of itself: the parts bench/wild.py and bench/capture.py share."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_in_namespaces(commands: dict[str, tuple[str, list[str]]], tmp: Path, deadline: float) -> list[str]:
    """Run each `name: (namespace, python arguments)` as `ip netns exec`, its output in
    `tmp/<name>.log`, until they end or the wall clock passes `deadline` (then they are killed);
    the names of those that failed, each with the end of its log said."""
    python = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else sys.executable
    procs = []
    for name, (space, args) in commands.items():
        log = (tmp / f"{name}.log").open("w")
        cmd = ["ip", "netns", "exec", space, python, *args]
        procs.append((name, subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), log))
    failed = []
    for name, proc, log in procs:
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child, by its id
            code = proc.wait()
        log.close()
        if code != 0:
            failed.append(name)
            say(f"process {name} ended with {code}; its log:\n" + (tmp / f"{name}.log").read_text()[-3000:])
    return failed


def row_lines(path: Path) -> list[str]:
    """The non-empty lines of a process's rows file (none if it wrote none)."""
    return [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def provenance(load_before: float, command: str) -> dict:
    """What a run's header says of where it ran: the load before and after, the commit and
    whether tracked files were changed, the command and the machine."""
    return {
        "load_before": load_before, "load_after": round(os.getloadavg()[0], 2),
        "commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "command": command, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}",
    }  # fmt: skip


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)
