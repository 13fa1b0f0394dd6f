"""The gossip benchmark's report (bench/gossip.py): one run's table, and discovery off against on."""

from __future__ import annotations

import argparse
import os
import platform

from bench.gossip_groups import COMPLETION_CHARS, COMPLETIONS_PER_GROUP
from bench.gossip_swarm import Totals, percentile


def print_report(args: argparse.Namespace, result: dict) -> None:
    t: Totals = result["totals"]
    expected = result["expected"]
    messages = t.delivered + t.published
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print()
    where = f"{args.nodes} OS processes" if args.processes else "ONE trio process"
    print(
        f"gossip benchmark: {args.nodes} nodes ({args.topology}, discovery {'on' if result['discover'] else 'off'}) "
        f"in {where} on 127.0.0.1, real open_network (noise, yamux, gossipsub 1.1), {args.seconds:g} s of "
        f"publishing, {args.groups_per_round} groups / node / {args.round_seconds:g} s"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"load average {load:.2f} at the end. Numbers are CONTENDED when other jobs share the CPUs."
    )
    rows = [
        ("published groups", f"{t.published} (+{t.publish_failed} refused by publish)"),
        ("delivered / expected", f"{t.delivered} / {expected} = {t.delivered / expected if expected else 0:.4f}"),
        (
            "latency p50 / p99 / max",
            "{:.1f} / {:.1f} / {:.1f} ms".format(*(1e3 * percentile(t.latencies, q) for q in (50, 99, 100))),
        ),
        (
            "frame bytes per group (wire)",
            f"{mean(t.frame_bytes):,.0f} (min {min(t.frame_bytes, default=0):,}, "
            f"max {max(t.frame_bytes, default=0):,})",
        ),
        (
            "completion text bytes per group",
            f"{mean(t.text_bytes):,.0f} ({COMPLETIONS_PER_GROUP} x ~{COMPLETION_CHARS} chars)",
        ),
        ("wire / text", f"{mean(t.frame_bytes) / mean(t.text_bytes):.3f}" if t.text_bytes else "n/a"),
        (
            "process CPU" + (" (all nodes)" if args.processes else ""),
            f"{result['cpu_s']:.1f} s over {result['wall_s']:.1f} s wall "
            f"({100 * result['cpu_s'] / result['wall_s']:.0f}% of one core)",
        ),
        (
            "CPU per message",
            f"{1e3 * result['cpu_s'] / messages:.2f} ms (process CPU / (delivered + published) = {messages} messages)"
            if messages
            else "n/a",
        ),
        ("decode rejected", str(t.decode_rejected)),
        ("gossip counters (sum over nodes)", ", ".join(f"{k}={v}" for k, v in sorted(result["counters"].items()))),
        ("connections per node at the end", _links(result["links"])),
        ("setup", ", ".join(f"{k} {v:.1f}" for k, v in result["phases"].items())),
        (
            "peak RSS (sum over processes)" if args.processes else "peak RSS (whole process)",
            f"{result['max_rss_mb']:.0f} MB",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


def _links(links: list[int]) -> str:
    if not links:
        return "n/a"
    return f"mean {sum(links) / len(links):.1f}, min {min(links)}, max {max(links)}"


def print_comparison(args: argparse.Namespace, results: list[dict]) -> None:
    print()
    print(
        f"discovery off vs on, {args.nodes} nodes ({args.topology}, "
        f"{'one process per node' if args.processes else 'one process'}):"
    )
    print("discovery  delivered / expected      ratio   p50 ms   p99 ms   links per node (mean, min)")
    for result in results:
        t, expected = result["totals"], result["expected"]
        p50, p99 = (1e3 * percentile(t.latencies, q) for q in (50, 99))
        links = result["links"]
        print(
            f"{'on' if result['discover'] else 'off':<9}  {f'{t.delivered} / {expected}':<22}  "
            f"{t.delivered / expected if expected else 0:.4f}  {p50:7.1f}  {p99:7.1f}   "
            f"{sum(links) / len(links):.1f}, {min(links)}"
        )
