"""Run the `make run` swarm for hours and watch what each node holds: does anything grow?

Starts `sapo-node swarm` (3 nodes, SmolLM2-135M with LoRA, easy arithmetic: the defaults of
`make run`) and, every --interval seconds, samples each node process's RSS, open file
descriptors and threads (from /proc), its data dir's bytes (checkpoints, metrics.jsonl,
node.log and its rotated backups), its inbox size (the node's /api/status) and the rounds it
finished since the last sample with their round_seconds (its metrics.jsonl). The swarm process
itself is sampled too (RSS, fds, threads: it relays every node's output).

Everything lands in OUT/samples.jsonl (one JSON object per node per sample, written as it is
taken) with the run's settings in OUT/run.json; at the end it prints a table (per node, per
--table-minutes), draws OUT/longrun.png (one panel per quantity, one line per node) and checks
the bounds, printing PASS/FAIL for each (after a warm-up: --warmup-minutes if given, else
15 minutes or a node's first checkpoint if that comes later, as writing one raises the
allocator's high-water mark once):

- rss: the median of the last tenth of the samples within 10 % of the first tenth's;
- fds, threads: the same medians within a few descriptors / threads (flat, not drifting);
- data dir: checkpoints, status and identity within (keep_checkpoints + 1) x the largest
  checkpoint (+1: a new one is written before the oldest goes) + 1 MiB; the node.log family
  within the swarm's rotation cap; metrics.jsonl within its compaction cap (64 MiB,
  node/core/metrics.py), with its bytes per round reported;
- round time: the median round_seconds of the last quarter of the run within 25 % of the
  second quarter's (a leak that slows rounds down shows as a steady climb, and the plot shows
  it); and the CPU time per token generated or trained on, the same way: on a shared machine
  the wall-clock round time follows the other load and the length of the answers, the CPU
  time per token neither;
- progress: every node finished rounds in the last quarter.

    .venv/bin/python bench/longrun.py                          # 2 hours, into bench/results/longrun-<time>
    nice -n 5 .venv/bin/python bench/longrun.py --minutes 20 --note "what else ran"
    .venv/bin/python bench/longrun.py --from bench/results/longrun-<time>  # table, plot, verdicts again
    .venv/bin/python bench/longrun.py --smoke                  # the tiny model, 30 s, 3 s samples

Any other flag is a node setting passed to every node (as `sapo-node swarm` does).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# RUN_ARGS of the Makefile (`make run`), less --nodes and --data-dir, which the bench sets.
MAKE_RUN_ARGS = ["--model", "smollm2-135m", "--lora", "--tasks", "basic_arithmetic",
                 "--local", "2", "--external", "2", "--max-new-tokens", "128"]
SMOKE_ARGS = ["--model", "tiny", "--tasks", "basic_arithmetic", "--local", "2", "--external", "2",
              "--max-new-tokens", "24", "--generations", "4", "--warm-start-steps", "0", "--checkpoint-every", "2"]
PAGE_LINE = re.compile(r"^node (\d+): page (http://\S+)\s+log (\S+)$")
STATUS_TIMEOUT_SECONDS = 10.0
STOP_TIMEOUT_SECONDS = 300.0

# The bounds. Flat means: the last tenth's median within this many of the first tenth's.
RSS_GROWTH_LIMIT = 0.10
FD_TOLERANCE = 4  # a peer's connection or a page request in flight
THREAD_TOLERANCE = 3  # trio's idle worker threads linger for 10 s after each hand-off
ROUND_DRIFT_LIMIT = 0.25
DATA_SLACK_BYTES = 1 << 20  # status.json, identity.key, a partial write

# (key, panel title, divisor, unit) in the order of the table and the plot.
QUANTITIES = [
    ("rss_bytes", "RSS", 2**20, "MB"),
    ("fds", "open file descriptors", 1, ""),
    ("threads", "threads", 1, ""),
    ("data_dir_bytes", "data dir", 2**20, "MB"),
    ("logs_bytes", "node.log (+ backups)", 2**10, "KB"),
    ("inbox_size", "inbox", 1, "groups"),
]


# --- sampling --------------------------------------------------------------------------------


def proc_stats(pid: int) -> dict:
    """RSS, threads, open fds and CPU seconds so far of a live process, from /proc; {} if it is gone."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        # utime and stime, the 14th and 15th fields, counted after the ")" that ends the command name
        utime, stime = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]
    except (OSError, ValueError):
        return {}
    return {"rss_bytes": int(fields["VmRSS"].split()[0]) * 1024, "threads": int(fields["Threads"]), "fds": fds,
            "cpu_seconds": (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")}


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
    command = [sys.executable, "-m", "sapo.node.cli", "swarm", "--nodes", str(nodes), "--data-dir", str(out / "swarm"), *node_args]
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
            raise RuntimeError(f"the swarm exited (code {process.returncode}) before every node listened; see {log_path}")
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
            if str(data_dir) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):  # ours, not a reused pid
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
                rows.append({"node": "swarm", "time": now, "minute": (now - started) / 60, "pid": process.pid,
                             **proc_stats(process.pid), "load": os.getloadavg()[0]})
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
        parts.append(f"{r['node']}: r{r.get('round')} rss {r.get('rss_bytes', 0) / 2**20:.0f}MB fds {r.get('fds')} "
                     f"thr {r.get('threads')} log {r.get('logs_bytes', 0) / 1024:.0f}KB inbox {r.get('inbox_size')}")
    return " | ".join(parts)


# --- reading the samples back -----------------------------------------------------------------


def load(out: Path) -> tuple[dict, list[dict]]:
    meta = json.loads((out / "run.json").read_text())
    rows = []
    for line in (out / "samples.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the bench was killed mid-write
    return meta, rows


def by_node(rows: list[dict]) -> dict[str, list[dict]]:
    nodes: dict[str, list[dict]] = {}
    for row in rows:
        nodes.setdefault(row["node"], []).append(row)
    return dict(sorted(nodes.items(), key=lambda kv: (kv[0] == "swarm", kv[0])))


def round_times(rows: list[dict]) -> list[tuple[float, float]]:
    """(minute finished, round_seconds) of every round a node's samples saw."""
    if not rows:
        return []
    started = rows[0]["time"] - rows[0]["minute"] * 60
    return [((finished - started) / 60, seconds) for r in rows for _, seconds, finished, *_ in r.get("rounds", [])]


def table(meta: dict, rows: list[dict], every: float) -> str:
    head = f"{'node':8} {'minute':>6} {'round':>5} {'RSS MB':>7} {'fds':>4} {'thr':>4} {'data MB':>8} {'ckpts':>5} " \
           f"{'log KB':>7} {'metrics KB':>10} {'inbox':>5} {'round s':>7} {'CPU ms/tok':>10} {'load':>5}"
    lines = [head]
    for node, samples in by_node(rows).items():
        buckets: dict[int, list[dict]] = {}
        for s in samples:
            buckets.setdefault(int(s["minute"] // every), []).append(s)
        finished = round_times(samples)
        previous: dict | None = None
        for bucket, group in sorted(buckets.items()):
            last = group[-1]
            seconds = [sec for minute, sec in finished if bucket * every <= minute < (bucket + 1) * every]
            cpu = cpu_per_token(([previous] if previous else []) + group)
            previous = last
            lines.append(
                f"{node:8} {last['minute']:6.0f} {_fmt(last.get('round'), '5d')} {_fmt(last.get('rss_bytes'), '7.0f', 2**20)} "
                f"{_fmt(last.get('fds'), '4d')} {_fmt(last.get('threads'), '4d')} {_fmt(last.get('data_dir_bytes'), '8.1f', 2**20)} "
                f"{_fmt(last.get('checkpoints'), '5d')} {_fmt(last.get('logs_bytes'), '7.0f', 1024)} "
                f"{_fmt(last.get('metrics_bytes'), '10.1f', 1024)} {_fmt(last.get('inbox_size'), '5d')} "
                f"{_fmt(statistics.median(seconds) if seconds else None, '7.1f')} {_fmt(cpu, '10.2f', 1e-3)} {last['load']:5.1f}"
            )
    return "\n".join(lines)


def _fmt(value, spec: str, divisor: float = 1) -> str:
    width = int(re.match(r"\d+", spec).group())
    if value is None:
        return "-".rjust(width)
    return format(value / divisor if divisor != 1 else value, spec)


# --- the bounds --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    check: str
    node: str
    passed: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.check:11} {self.node:8} {self.detail}"


def _ends(values: list[float]) -> tuple[float, float]:
    """Medians of the first and the last tenth (at least 3 samples each)."""
    n = max(3, len(values) // 10)
    return statistics.median(values[:n]), statistics.median(values[-n:])


def warmup_end(meta: dict, samples: list[dict]) -> float:
    """The minute a node's one-time costs are behind it: --warmup-minutes if given, else 15
    minutes or its first checkpoint if that came later (writing one raises the allocator's
    high-water mark once)."""
    if meta.get("warmup_given"):
        return meta["warmup_minutes"]
    first_checkpoint = next((s["minute"] for s in samples if s.get("checkpoints")), 0.0)
    return max(meta["warmup_minutes"], first_checkpoint)


def verdicts(meta: dict, rows: list[dict]) -> list[Verdict]:
    found = []
    for node, samples in by_node(rows).items():
        warmup = warmup_end(meta, samples)
        after = [s for s in samples if s["minute"] >= warmup and "rss_bytes" in s]
        if len(after) < 6:
            found.append(Verdict("samples", node, False, f"{len(after)} samples after the warm-up (to minute {warmup:.0f}); need 6"))
            continue
        first, last = _ends([s["rss_bytes"] for s in after])
        growth = last / first - 1
        found.append(Verdict("rss", node, growth <= RSS_GROWTH_LIMIT,
                             f"{first / 2**20:.0f} -> {last / 2**20:.0f} MB from minute {warmup:.0f} "
                             f"({growth:+.1%}; limit +{RSS_GROWTH_LIMIT:.0%})"))
        for key, tolerance in (("fds", FD_TOLERANCE), ("threads", THREAD_TOLERANCE)):
            first, last = _ends([s[key] for s in after])
            peak = max(s[key] for s in after)
            found.append(Verdict(key, node, last - first <= tolerance,
                                 f"median {first:g} -> {last:g} (max {peak}; limit +{tolerance})"))
        if node != "swarm":
            found += node_verdicts(meta, node, samples, after)
    return found


def node_verdicts(meta: dict, node: str, samples: list[dict], after: list[dict]) -> list[Verdict]:
    found = []
    keep = meta["keep_checkpoints"]
    checkpoint = max((s["checkpoints_bytes"] / s["checkpoints"] for s in samples if s.get("checkpoints")), default=0)
    bound = (keep + 1) * checkpoint + DATA_SLACK_BYTES
    rest = max(s["data_dir_bytes"] - s["metrics_bytes"] - s["logs_bytes"] for s in after)
    found.append(Verdict("data dir", node, rest <= bound,
                         f"max {rest / 2**20:.1f} MB without logs and metrics; bound ({keep}+1) x {checkpoint / 2**20:.1f} MB + 1 MB "
                         f"= {bound / 2**20:.1f} MB"))
    cap = meta.get("log_cap_bytes")
    logs = max(s["logs_bytes"] for s in samples)
    hours = (samples[-1]["time"] - samples[0]["time"]) / 3600
    rate = (samples[-1]["logs_bytes"] - samples[0]["logs_bytes"]) / max(hours, 1e-9)
    if cap:
        found.append(Verdict("log", node, logs <= cap, f"max {logs / 1024:.0f} KB in {max(s['log_files'] for s in samples)} "
                             f"file(s), cap {cap / 2**20:.0f} MB; written at {rate / 1024:.0f} KB/h"))
    else:
        found.append(Verdict("log", node, False, f"no rotation cap: {logs / 1024:.0f} KB, growing {rate / 1024:.0f} KB/h without bound"))
    from sapo.node.core.metrics import MAX_METRICS_BYTES

    rounds = samples[-1].get("round") or 0
    if rounds:
        largest = max(s["metrics_bytes"] for s in samples)
        per_round = samples[-1]["metrics_bytes"] / rounds
        found.append(Verdict("metrics", node, largest <= MAX_METRICS_BYTES,
                             f"metrics.jsonl max {largest / 2**20:.1f} MB, cap {MAX_METRICS_BYTES / 2**20:.0f} MB "
                             f"(compacted past it); {per_round:.0f} bytes/round so far"))
    found += round_verdicts(meta, node, samples)
    return found


def round_verdicts(meta: dict, node: str, samples: list[dict]) -> list[Verdict]:
    warmup, end = warmup_end(meta, samples), samples[-1]["minute"]
    quarter = (end - warmup) / 4
    finished = [(m, s) for m, s in round_times(samples) if m >= warmup]
    second = [s for m, s in finished if warmup + quarter <= m < warmup + 2 * quarter]
    fourth = [s for m, s in finished if m >= warmup + 3 * quarter]
    found = [Verdict("progress", node, bool(fourth), f"{len(fourth)} rounds in the last quarter, {len(finished)} after warm-up")]
    # CPU time per token generated or trained on: what a leak that slows the round costs, without
    # what the machine's other load adds to the wall clock or how long this round's answers were.
    cpu = [cpu_per_token([s for s in samples if lo <= s["minute"] <= hi])
           for lo, hi in ((warmup + quarter, warmup + 2 * quarter), (warmup + 3 * quarter, end))]
    if None in cpu:
        found.append(Verdict("cpu/token", node, False, "too few rounds or no CPU samples to compare the 2nd and 4th quarters"))
    else:
        q2, q4 = cpu
        found.append(Verdict("cpu/token", node, abs(q4 / q2 - 1) <= ROUND_DRIFT_LIMIT,
                             f"{q2 * 1e3:.2f} CPU ms a token (2nd quarter) -> {q4 * 1e3:.2f} (4th): {q4 / q2 - 1:+.0%}, "
                             f"limit +-{ROUND_DRIFT_LIMIT:.0%}"))
    if len(second) >= 3 and len(fourth) >= 3:
        q2, q4 = statistics.median(second), statistics.median(fourth)
        found.append(Verdict("round time", node, abs(q4 / q2 - 1) <= ROUND_DRIFT_LIMIT,
                             f"median {q2:.1f} s (2nd quarter, {len(second)} rounds) -> {q4:.1f} s (4th, {len(fourth)}): "
                             f"{q4 / q2 - 1:+.0%}, limit +-{ROUND_DRIFT_LIMIT:.0%}"))
    else:
        found.append(Verdict("round time", node, False, f"too few rounds to compare: {len(second)} in the 2nd quarter, "
                             f"{len(fourth)} in the 4th (need 3 each)"))
    return found


def cpu_per_token(samples: list[dict]) -> float | None:
    """CPU seconds the node used per token of the rounds it finished, from the first sample to
    the last (each sample lists the rounds finished since the one before)."""
    timed = [s for s in samples if s.get("cpu_seconds") is not None]
    if len(timed) < 2:
        return None
    tokens = sum(r[3] for s in timed[1:] for r in s.get("rounds", []) if len(r) > 3)
    rounds = sum(len(s.get("rounds", [])) for s in timed[1:])
    if rounds < 2 or not tokens:
        return None
    return (timed[-1]["cpu_seconds"] - timed[0]["cpu_seconds"]) / tokens


# --- the plot ----------------------------------------------------------------------------------


def plot(meta: dict, rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = by_node(rows)
    panels = [*QUANTITIES, ("round_seconds", "round time", 1, "s")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.2 * len(panels)), sharex=True)
    for ax, (key, title, divisor, unit) in zip(axes, panels):
        for node, samples in nodes.items():
            if key == "round_seconds":
                points = round_times(samples)
            else:
                points = [(s["minute"], s[key] / divisor) for s in samples if s.get(key) is not None]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, label=node, linestyle="--" if node == "swarm" else "-", marker="." if key == "round_seconds" else None)
        ax.axvline(meta["warmup_minutes"], color="grey", linewidth=0.8, linestyle=":")
        ax.set_ylabel(f"{title}\n({unit})" if unit else title, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, ncol=len(nodes))
    args = textwrap.fill(" ".join(meta["node_args"]), 110)
    axes[0].set_title(f"{meta['nodes']}-node swarm, {args}\n"
                      f"{meta['minutes']:g} min, samples every {meta['interval']:g} s (dotted: end of warm-up)", fontsize=9)
    axes[-1].set_xlabel("minutes since the swarm started")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out: Path, every: float, warmup_minutes: float | None = None) -> int:
    meta, rows = load(out)
    if warmup_minutes is not None:
        meta["warmup_minutes"], meta["warmup_given"] = warmup_minutes, True
    print(f"long run: {meta['nodes']} nodes, {' '.join(meta['node_args'])}; {meta['minutes']:g} min planned, "
          f"samples every {meta['interval']:g} s, warm-up {meta['warmup_minutes']:g} min; started {meta['started']}")
    if meta.get("note"):
        print(f"note: {meta['note']}")
    print(table(meta, rows, every))
    plot(meta, rows, out / "longrun.png")
    print(f"plot: {out / 'longrun.png'}")
    results = verdicts(meta, rows)
    for v in results:
        print(v.line())
    failed = [v for v in results if not v.passed]
    print(f"{len(results) - len(failed)} of {len(results)} checks passed")
    return 1 if failed else 0


# --- entry point -------------------------------------------------------------------------------


def keep_checkpoints(node_args: list[str]) -> int:
    from sapo.node.core.flags import node_settings_from_flags

    return node_settings_from_flags(node_args).run.keep_checkpoints


def log_cap_bytes() -> int | None:
    """What the swarm's node.log rotation keeps at most, if this version rotates it."""
    from sapo.node import swarm

    cap, backups = getattr(swarm, "NODE_LOG_MAX_BYTES", None), getattr(swarm, "NODE_LOG_BACKUPS", 0)
    return cap * (backups + 1) if cap else None


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--minutes", type=float, default=120.0, help="how long the swarm runs (default: 120)")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between samples (default: 60)")
    parser.add_argument("--warmup-minutes", type=float, default=None,
                        help="samples before this are not judged (default: 15, or a quarter of a shorter run, or "
                        "a node's first checkpoint if later; with --from, judge again from another minute)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="results dir (default: bench/results/longrun-<time>)")
    parser.add_argument("--from", dest="from_dir", type=Path, default=None, help="re-render an earlier run's table, plot and verdicts")
    parser.add_argument("--table-minutes", type=float, default=None, help="table rows every this many minutes (default: 10)")
    parser.add_argument("--note", default="", help="what else ran on the machine, for the record")
    parser.add_argument("--smoke", action="store_true", help="the tiny model for 30 s, sampled every 3 s")
    args, node_args = parser.parse_known_args(argv)
    if args.from_dir is not None:
        return report(args.from_dir, args.table_minutes or 10.0, args.warmup_minutes)
    if args.smoke:
        args.minutes, args.interval = min(args.minutes, 0.5), min(args.interval, 3.0)
        node_args = node_args or SMOKE_ARGS
        if args.warmup_minutes is None:  # half a minute has room for no checkpoint rule under load
            args.warmup_minutes = 0.1
    node_args = node_args or MAKE_RUN_ARGS
    if args.minutes <= 0 or args.interval <= 0:
        parser.error("--minutes and --interval must be positive")
    out = args.out or ROOT / "bench" / "results" / time.strftime("longrun-%Y%m%d-%H%M")
    warmup = args.warmup_minutes if args.warmup_minutes is not None else min(15.0, args.minutes / 4)
    meta = {
        "nodes": args.nodes, "node_args": node_args, "minutes": args.minutes, "interval": args.interval,
        "warmup_minutes": warmup, "warmup_given": args.warmup_minutes is not None, "keep_checkpoints": keep_checkpoints(node_args), "log_cap_bytes": log_cap_bytes(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": git_commit(), "cpus": os.cpu_count(),
        "load_at_start": os.getloadavg()[0], "note": args.note,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"long run into {out}: {args.nodes} nodes, {' '.join(node_args)}, {args.minutes:g} min", flush=True)
    run(out, meta)
    return report(out, args.table_minutes or (1.0 if args.smoke else 10.0))


if __name__ == "__main__":
    sys.exit(main())
