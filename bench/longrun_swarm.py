"""The long run's swarm (bench/longrun.py): start `sapo-node swarm`, sample every node each interval, stop it.

Each sample reads a node's RSS, open fds, threads and CPU time (from /proc), its data dir's
bytes (checkpoints, metrics.jsonl, node.log and its rotated backups), its inbox size (the node's
/api/status) and the rounds it finished since the last sample (its metrics.jsonl); the swarm
process itself is sampled too. Samples go to OUT/samples.jsonl as they are taken.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE_LINE = re.compile(r"^node (\d+): page (http://\S+)\s+log (\S+)$")
STATUS_TIMEOUT_SECONDS = 10.0
STOP_TIMEOUT_SECONDS = 300.0


def proc_stats(pid: int) -> dict:
    """RSS, threads, open fds and CPU seconds so far of a live process, from /proc; {} if it is gone."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        # utime and stime, the 14th and 15th fields, counted after the ")" that ends the command name
        utime, stime = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]
    except (OSError, ValueError):
        return {}
    return {
        "rss_bytes": int(fields["VmRSS"].split()[0]) * 1024,
        "threads": int(fields["Threads"]),
        "fds": fds,
        "cpu_seconds": (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK"),
    }


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass  # a checkpoint pruned while we walk
    return total


def data_dir_stats(data_dir: Path) -> dict:
    checkpoints = data_dir / "checkpoints"
    rounds = [p for p in checkpoints.iterdir() if p.name.startswith("round-")] if checkpoints.is_dir() else []
    logs = [p for p in data_dir.glob("node.log*") if p.is_file()]
    return {
        "data_dir_bytes": tree_bytes(data_dir),
        "checkpoints_bytes": tree_bytes(checkpoints),
        "checkpoints": len(rounds),
        "metrics_bytes": _size(data_dir / "metrics.jsonl"),
        "node_log_bytes": _size(data_dir / "node.log"),
        "logs_bytes": sum(_size(p) for p in logs),
        "log_files": len(logs),
    }


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def fetch_status(page: str) -> dict | None:
    try:
        with urllib.request.urlopen(page.rstrip("/") + "/api/status", timeout=STATUS_TIMEOUT_SECONDS) as reply:
            return json.loads(reply.read())
    except (OSError, ValueError):
        return None


def rounds_after(data_dir: Path, after: int) -> list[list[float]]:
    """[round, round_seconds, finished at, tokens generated and trained on] of the rounds in
    metrics.jsonl past `after`."""
    found = []
    try:
        with (data_dir / "metrics.jsonl").open() as lines:  # a line at a time: read every sample, for days
            for line in lines:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line being written
                if row["round"] > after:
                    tokens = row.get("generated_tokens", 0) + row.get("augment_tokens", 0) + row.get("update_tokens", 0)
                    found.append([row["round"], row["round_seconds"], row["time"], tokens])
    except OSError:
        return []
    return found


@dataclass
class Member:
    index: int
    page: str
    data_dir: Path
    last_round: int = 0


def sample_member(member: Member, now: float, started: float) -> dict:
    status = fetch_status(member.page) or {}
    pid = status.get("pid")
    rounds = rounds_after(member.data_dir, member.last_round)
    if rounds:
        member.last_round = int(rounds[-1][0])
    return {
        "node": f"node-{member.index}",
        "time": now,
        "minute": (now - started) / 60,
        "pid": pid,
        **(proc_stats(pid) if pid else {}),
        **data_dir_stats(member.data_dir),
        "phase": status.get("phase"),
        "round": status.get("round", member.last_round),
        "inbox_size": status.get("inbox_size"),
        "peers": sum(1 for p in status.get("peers", []) if p.get("connected")),
        "rounds": rounds,
        "load": os.getloadavg()[0],
    }


def start_swarm(out: Path, nodes: int, node_args: list[str]) -> tuple[subprocess.Popen, Path]:
    log_path = out / "swarm.out"
    command = [
        sys.executable,
        "-m",
        "sapo.node.cli",
        "swarm",
        "--nodes",
        str(nodes),
        "--data-dir",
        str(out / "swarm"),
        *node_args,
    ]
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    return process, log_path


def wait_for_members(process: subprocess.Popen, log_path: Path, nodes: int, timeout: float) -> list[Member]:
    """The swarm prints each node's page and log once that node listens (node 0 loads the
    model first, so this waits for the conversion of SmolLM2 on a first run)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [PAGE_LINE.match(line) for line in log_path.read_text(errors="replace").splitlines()]
        members = [Member(int(m.group(1)), m.group(2), Path(m.group(3)).parent) for m in found if m]
        if len(members) == nodes:
            return members
        if process.poll() is not None:
            raise RuntimeError(
                f"the swarm exited (code {process.returncode}) before every node listened; see {log_path}"
            )
        time.sleep(1.0)
    raise RuntimeError(f"not every node listened within {timeout:.0f}s; see {log_path}")


def stop_swarm(process: subprocess.Popen, pids: list[int], data_dir: Path) -> None:
    """Ctrl-C, as a person would: each node finishes its step and checkpoints."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for pid in pids:  # the nodes run in sessions of their own: none may outlive the bench
        try:
            if str(data_dir) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
                errors="replace"
            ):  # ours, not a reused pid
                os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def run(out: Path, meta: dict) -> None:
    """Start the swarm, sample it until --minutes after every node listens, stop it."""
    nodes, minutes, interval = meta["nodes"], meta["minutes"], meta["interval"]
    launched = time.time()
    process, log_path = start_swarm(out, nodes, meta["node_args"])
    pids: set[int] = set()
    try:
        members = wait_for_members(process, log_path, nodes, timeout=1800)
        # Minutes count from here: node 0's first conversion of SmolLM2 is not the run.
        started = time.time()
        meta["startup_seconds"] = round(started - launched, 1)
        (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"swarm up after {started - launched:.0f}s: " + ", ".join(m.page for m in members), flush=True)
        with (out / "samples.jsonl").open("a") as samples:
            next_at = time.time()
            while time.time() - started < minutes * 60 and process.poll() is None:
                now = time.time()
                rows = [sample_member(m, now, started) for m in members]
                rows.append(
                    {
                        "node": "swarm",
                        "time": now,
                        "minute": (now - started) / 60,
                        "pid": process.pid,
                        **proc_stats(process.pid),
                        "load": os.getloadavg()[0],
                    }
                )
                pids.update(r["pid"] for r in rows[:-1] if r.get("pid"))
                for row in rows:
                    samples.write(json.dumps(row) + "\n")
                samples.flush()
                print(progress_line(rows), flush=True)
                next_at += interval
                time.sleep(max(0.0, next_at - time.time()))
        if process.poll() is not None:
            print(f"the swarm exited early (code {process.returncode}); see {log_path}", flush=True)
    finally:
        stop_swarm(process, sorted(pids), out / "swarm")


def progress_line(rows: list[dict]) -> str:
    parts = [f"{rows[0]['minute']:.1f} min"]
    for r in rows:
        if r["node"] == "swarm":
            continue
        parts.append(
            f"{r['node']}: r{r.get('round')} rss {r.get('rss_bytes', 0) / 2**20:.0f}MB fds {r.get('fds')} "
            f"thr {r.get('threads')} log {r.get('logs_bytes', 0) / 1024:.0f}KB inbox {r.get('inbox_size')}"
        )
    return " | ".join(parts)
