"""The long run's report (bench/longrun.py): the samples read back, the table, the plot and the verdicts."""

from __future__ import annotations

import json
import re
import statistics
import textwrap
from pathlib import Path

from bench.longrun_verdicts import by_node, cpu_per_token, round_times, verdicts

# (key, panel title, divisor, unit) in the order of the table and the plot.
QUANTITIES = [
    ("rss_bytes", "RSS", 2**20, "MB"),
    ("fds", "open file descriptors", 1, ""),
    ("threads", "threads", 1, ""),
    ("data_dir_bytes", "data dir", 2**20, "MB"),
    ("logs_bytes", "node.log (+ backups)", 2**10, "KB"),
    ("inbox_size", "inbox", 1, "groups"),
]


def load(out: Path) -> tuple[dict, list[dict]]:
    meta = json.loads((out / "run.json").read_text())
    rows = []
    for line in (out / "samples.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the bench was killed mid-write
    return meta, rows


def table(meta: dict, rows: list[dict], every: float) -> str:
    head = (
        f"{'node':8} {'minute':>6} {'round':>5} {'RSS MB':>7} {'fds':>4} {'thr':>4} {'data MB':>8} {'ckpts':>5} "
        f"{'log KB':>7} {'metrics KB':>10} {'inbox':>5} {'round s':>7} {'CPU ms/tok':>10} {'load':>5}"
    )
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
                ax.plot(
                    xs,
                    ys,
                    label=node,
                    linestyle="--" if node == "swarm" else "-",
                    marker="." if key == "round_seconds" else None,
                )
        ax.axvline(meta["warmup_minutes"], color="grey", linewidth=0.8, linestyle=":")
        ax.set_ylabel(f"{title}\n({unit})" if unit else title, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, ncol=len(nodes))
    args = textwrap.fill(" ".join(meta["node_args"]), 110)
    axes[0].set_title(
        f"{meta['nodes']}-node swarm, {args}\n"
        f"{meta['minutes']:g} min, samples every {meta['interval']:g} s (dotted: end of warm-up)",
        fontsize=9,
    )
    axes[-1].set_xlabel("minutes since the swarm started")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out: Path, every: float, warmup_minutes: float | None = None) -> int:
    meta, rows = load(out)
    if warmup_minutes is not None:
        meta["warmup_minutes"], meta["warmup_given"] = warmup_minutes, True
    print(
        f"long run: {meta['nodes']} nodes, {' '.join(meta['node_args'])}; {meta['minutes']:g} min planned, "
        f"samples every {meta['interval']:g} s, warm-up {meta['warmup_minutes']:g} min; started {meta['started']}"
    )
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
