"""bench/gossip_during_update.py's record of a run and its report: which phase each message's
flight falls in, the latency and loop-lag figures per phase, and the printed table."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Protocol

from bench.gossip_swarm import percentile
from bench.text_table import print_rows

LAG_PROBE_SECONDS = 0.010  # how long the loop-lag probe sleeps; lateness is measured past it


class RoundFacts(Protocol):
    """What the report says of the round the busy phases ran (gossip_during_update.Trainer)."""

    reward_mean: float
    real_signal: int
    groups: list


@dataclass
class Record:
    received: dict[int, tuple[float, float]] = field(default_factory=dict)  # seq -> (sent, received)
    lag: list[tuple[float, float]] = field(default_factory=list)  # (woke at, seconds late)
    windows: list[tuple[str, float, float]] = field(default_factory=list)  # (phase, start, end)
    update_seconds: list[float] = field(default_factory=list)
    update_tokens: list[int] = field(default_factory=list)
    skipped: int = 0
    rejected: int = 0
    counters: dict = field(default_factory=dict)
    setup: dict = field(default_factory=dict)


@dataclass
class PhaseFigures:
    sent: int = 0
    latencies: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)
    seconds: float = 0.0


def phase_of(
    windows: list[tuple[str, float, float]], sent: float, received: float | None, busy: str = "update"
) -> str | None:
    """The busy phase if the flight overlaps one, else the phase that holds all of it."""
    end = sent if received is None else received
    for phase, start, stop in windows:
        if phase == busy and sent <= stop and end >= start:
            return busy
    for phase, start, stop in windows:
        if start <= sent and end <= stop:
            return phase
    return None


def figures(record: Record, sent: dict[int, float], busy: str = "update") -> dict[str, PhaseFigures]:
    phases = {name: PhaseFigures() for name in ("idle", "update", "generate")}
    for name, start, stop in record.windows:
        phases[name].seconds += stop - start
    for seq, sent_at in sent.items():
        received = record.received.get(seq)
        phase = phase_of(record.windows, sent_at, received[1] if received else None, busy)
        if phase is None:
            continue  # sent before the first phase or after the last
        phases[phase].sent += 1
        if received:
            phases[phase].latencies.append(received[1] - received[0])
    for woke, late in record.lag:
        phase = phase_of(record.windows, woke - LAG_PROBE_SECONDS - late, woke, busy)
        if phase is not None:
            phases[phase].lag.append(late)
    return phases


def print_report(args: argparse.Namespace, record: Record, trainer: RoundFacts, sent: dict[int, float]) -> float:
    phases = figures(record, sent, args.busy)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    ms = lambda values, q: f"{1e3 * percentile(values, q):.1f}" if values else "-"  # noqa: E731
    print()
    print(
        f"gossip latency during a GRPO {'update' if args.busy == 'update' else 'generation'}: receiver A (trio, real "
        f"open_network, {'grpo_update' if args.busy == 'update' else 'generate_groups'} in "
        f"trio.to_thread.run_sync) and sender B (own OS process) on 127.0.0.1, {args.rate:g} RolloutGroup frames/s"
    )
    print(
        f"model {args.model}, {'LoRA r=16' if args.lora else 'full fine-tuning'}, update precision {args.precision}, torch threads {args.threads}, "
        f"round {args.questions} questions x {args.generations} generations, max_new_tokens {args.max_new_tokens}, "
        f"{args.cycles} x ({args.idle_seconds:g} s idle + {args.busy_seconds:g} s of {args.busy.replace('generate', 'generation')}s), "
        f"GIL switch interval {1e3 * sys.getswitchinterval():g} ms"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, load average "
        f"{load:.2f} at the end. Numbers are CONTENDED when other jobs share the CPUs."
    )
    rows = [
        [
            "phase",
            "seconds",
            "messages",
            "delivered / sent",
            "p50 ms",
            "p99 ms",
            "max ms",
            "loop lag p99 ms",
            "loop lag max ms",
        ]
    ]
    for name, p in phases.items():
        rows.append(
            [
                name,
                f"{p.seconds:.1f}",
                str(len(p.latencies)),
                f"{len(p.latencies)} / {p.sent}",
                ms(p.latencies, 50),
                ms(p.latencies, 99),
                ms(p.latencies, 100),
                ms(p.lag, 99),
                ms(p.lag, 100),
            ]
        )
    print_rows(rows)
    idle, busy = phases["idle"].latencies, phases[args.busy].latencies
    ratio = percentile(busy, 99) / percentile(idle, 99) if idle and busy else float("nan")
    target = 2.0 if args.busy == "update" else 1.5
    print(
        f"ratio p99({args.busy}) / p99(idle): {ratio:.2f} (target <= {target:g}: {'met' if ratio <= target else 'NOT met'})"
    )
    seconds = record.update_seconds
    if args.busy == "update":
        work = (
            f"updates: {len(seconds)} ({record.skipped} skipped), seconds p50 / max {percentile(seconds, 50):.2f} / "
            f"{max(seconds):.2f}, {sum(record.update_tokens) // max(1, len(seconds))} completion tokens each"
        )
    else:
        work = (
            f"generations: {len(seconds)}, seconds p50 / max {percentile(seconds, 50):.2f} / {max(seconds):.2f}, "
            f"{sum(record.update_tokens) // max(1, len(seconds))} new tokens each "
            f"({sum(record.update_tokens) / max(sum(seconds), 1e-9):.0f} tokens per wall second)"
        )
    print(
        f"{work}; round reward {trainer.reward_mean:.3f}, {trainer.real_signal}/{len(trainer.groups)} groups with real "
        "signal" + (" (the rest forced 0/1)" if args.force_signal else "")
    )
    print(
        "setup: "
        + ", ".join(f"{k} {v:.1f}" for k, v in record.setup.items())
        + f"; decode rejected {record.rejected}; receiver counters "
        + ", ".join(f"{k}={v}" for k, v in sorted(record.counters.items()))
    )
    return ratio
