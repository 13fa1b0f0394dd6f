"""The long run's bounds (bench/longrun.py): PASS or FAIL per node for each quantity that must not grow.

After a warm-up: RSS within +10 % (median of the last tenth against the first tenth), fds and
threads within a few, the data dir within (keep_checkpoints + 1) checkpoints + 1 MiB besides
logs and metrics, the logs within the swarm's rotation cap, metrics.jsonl within its compaction
cap, the round time and the CPU time per token of the last quarter within 25 % of the second
quarter's, and rounds done in the last quarter.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# The bounds. Flat means: the last tenth's median within this many of the first tenth's.
RSS_GROWTH_LIMIT = 0.10
FD_TOLERANCE = 4  # a peer's connection or a page request in flight
THREAD_TOLERANCE = 3  # trio's idle worker threads linger for 10 s after each hand-off
ROUND_DRIFT_LIMIT = 0.25
DATA_SLACK_BYTES = 1 << 20  # status.json, identity.key, a partial write


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
            found.append(
                Verdict(
                    "samples", node, False, f"{len(after)} samples after the warm-up (to minute {warmup:.0f}); need 6"
                )
            )
            continue
        first, last = _ends([s["rss_bytes"] for s in after])
        growth = last / first - 1
        found.append(
            Verdict(
                "rss",
                node,
                growth <= RSS_GROWTH_LIMIT,
                f"{first / 2**20:.0f} -> {last / 2**20:.0f} MB from minute {warmup:.0f} "
                f"({growth:+.1%}; limit +{RSS_GROWTH_LIMIT:.0%})",
            )
        )
        for key, tolerance in (("fds", FD_TOLERANCE), ("threads", THREAD_TOLERANCE)):
            first, last = _ends([s[key] for s in after])
            peak = max(s[key] for s in after)
            found.append(
                Verdict(
                    key,
                    node,
                    last - first <= tolerance,
                    f"median {first:g} -> {last:g} (max {peak}; limit +{tolerance})",
                )
            )
        if node != "swarm":
            found += node_verdicts(meta, node, samples, after)
    return found


def node_verdicts(meta: dict, node: str, samples: list[dict], after: list[dict]) -> list[Verdict]:
    found = []
    keep = meta["keep_checkpoints"]
    checkpoint = max((s["checkpoints_bytes"] / s["checkpoints"] for s in samples if s.get("checkpoints")), default=0)
    bound = (keep + 1) * checkpoint + DATA_SLACK_BYTES
    rest = max(s["data_dir_bytes"] - s["metrics_bytes"] - s["logs_bytes"] for s in after)
    found.append(
        Verdict(
            "data dir",
            node,
            rest <= bound,
            f"max {rest / 2**20:.1f} MB without logs and metrics; bound ({keep}+1) x {checkpoint / 2**20:.1f} MB + 1 MB "
            f"= {bound / 2**20:.1f} MB",
        )
    )
    cap = meta.get("log_cap_bytes")
    logs = max(s["logs_bytes"] for s in samples)
    hours = (samples[-1]["time"] - samples[0]["time"]) / 3600
    rate = (samples[-1]["logs_bytes"] - samples[0]["logs_bytes"]) / max(hours, 1e-9)
    if cap:
        found.append(
            Verdict(
                "log",
                node,
                logs <= cap,
                f"max {logs / 1024:.0f} KB in {max(s['log_files'] for s in samples)} "
                f"file(s), cap {cap / 2**20:.0f} MB; written at {rate / 1024:.0f} KB/h",
            )
        )
    else:
        found.append(
            Verdict(
                "log",
                node,
                False,
                f"no rotation cap: {logs / 1024:.0f} KB, growing {rate / 1024:.0f} KB/h without bound",
            )
        )
    from sapo.node.core.metrics import MAX_METRICS_BYTES

    rounds = samples[-1].get("round") or 0
    if rounds:
        largest = max(s["metrics_bytes"] for s in samples)
        per_round = samples[-1]["metrics_bytes"] / rounds
        found.append(
            Verdict(
                "metrics",
                node,
                largest <= MAX_METRICS_BYTES,
                f"metrics.jsonl max {largest / 2**20:.1f} MB, cap {MAX_METRICS_BYTES / 2**20:.0f} MB "
                f"(compacted past it); {per_round:.0f} bytes/round so far",
            )
        )
    found += round_verdicts(meta, node, samples)
    return found


def round_verdicts(meta: dict, node: str, samples: list[dict]) -> list[Verdict]:
    warmup, end = warmup_end(meta, samples), samples[-1]["minute"]
    quarter = (end - warmup) / 4
    finished = [(m, s) for m, s in round_times(samples) if m >= warmup]
    second = [s for m, s in finished if warmup + quarter <= m < warmup + 2 * quarter]
    fourth = [s for m, s in finished if m >= warmup + 3 * quarter]
    found = [
        Verdict(
            "progress", node, bool(fourth), f"{len(fourth)} rounds in the last quarter, {len(finished)} after warm-up"
        )
    ]
    # CPU time per token generated or trained on: what a leak that slows the round costs, without
    # what the machine's other load adds to the wall clock or how long this round's answers were.
    cpu = [
        cpu_per_token([s for s in samples if lo <= s["minute"] <= hi])
        for lo, hi in ((warmup + quarter, warmup + 2 * quarter), (warmup + 3 * quarter, end))
    ]
    if None in cpu:
        found.append(
            Verdict("cpu/token", node, False, "too few rounds or no CPU samples to compare the 2nd and 4th quarters")
        )
    else:
        q2, q4 = cpu
        found.append(
            Verdict(
                "cpu/token",
                node,
                abs(q4 / q2 - 1) <= ROUND_DRIFT_LIMIT,
                f"{q2 * 1e3:.2f} CPU ms a token (2nd quarter) -> {q4 * 1e3:.2f} (4th): {q4 / q2 - 1:+.0%}, "
                f"limit +-{ROUND_DRIFT_LIMIT:.0%}",
            )
        )
    if len(second) >= 3 and len(fourth) >= 3:
        q2, q4 = statistics.median(second), statistics.median(fourth)
        found.append(
            Verdict(
                "round time",
                node,
                abs(q4 / q2 - 1) <= ROUND_DRIFT_LIMIT,
                f"median {q2:.1f} s (2nd quarter, {len(second)} rounds) -> {q4:.1f} s (4th, {len(fourth)}): "
                f"{q4 / q2 - 1:+.0%}, limit +-{ROUND_DRIFT_LIMIT:.0%}",
            )
        )
    else:
        found.append(
            Verdict(
                "round time",
                node,
                False,
                f"too few rounds to compare: {len(second)} in the 2nd quarter, {len(fourth)} in the 4th (need 3 each)",
            )
        )
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
