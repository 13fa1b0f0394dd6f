"""bench/shared_base.py's report: each mode's seconds, memory and tokens per swarm-round from
what its workers measured, as the printed table and the --json records."""

from __future__ import annotations

import os
import platform
import statistics
from dataclasses import dataclass
from typing import Protocol

from bench.text_table import print_rows


class PeakMemory(Protocol):
    """What the report reads of shared_base.PeakMemory: a mode's peak RSS and GPU bytes."""

    peak: int
    gpu_peak: int


@dataclass
class Measured:
    """What both modes saw: each separate worker's result and the swarm-rounds they made together,
    the shared worker's result, and the peak memory of each mode."""

    separate_rounds: list[float]
    separate: list[dict]
    separate_memory: PeakMemory
    separate_wall: float
    shared: dict
    shared_memory: PeakMemory

    @property
    def separate_round(self) -> float:
        # All N processes decode at once: a swarm-round ends when the slowest node's round does.
        return statistics.median(self.separate_rounds)


def modes_of(args, measured: Measured) -> list[tuple[str, float, int, float]]:
    """Each mode's (label, seconds per swarm-round, peak memory, tokens per round)."""
    shared = measured.shared
    tokens = {
        "separate": sum(r["tokens"] for r in measured.separate) / args.rounds,
        "one_by_one": shared["tokens"]["one_by_one"] / args.rounds,
        "mixed": shared["tokens"]["mixed"] / args.rounds,
    }
    return [
        (
            f"separate: {args.nodes} processes, 1 thread each",
            measured.separate_round,
            measured.separate_memory.peak,
            tokens["separate"],
        ),
        (
            f"shared, one by one: 1 process, {args.threads} threads",
            statistics.median(shared["one_by_one"]),
            measured.shared_memory.peak,
            tokens["one_by_one"],
        ),
        (
            f"shared, mixed batch: 1 process, {args.threads} threads",
            statistics.median(shared["mixed"]),
            measured.shared_memory.peak,
            tokens["mixed"],
        ),
    ]


def gpu_reserved(measured: Measured, sampled: int | None) -> dict[str, int]:
    """What torch reserved, summed over each mode's processes; without NVML it stands in for the
    sampled peaks (no CUDA contexts then)."""
    reserved = {
        "separate": sum(r["torch_reserved"] for r in measured.separate),
        "shared": measured.shared["torch_reserved"],
    }
    if sampled is None:
        measured.separate_memory.gpu_peak, measured.shared_memory.gpu_peak = reserved["separate"], reserved["shared"]
    return reserved


def print_header(args, separate_wall: float) -> None:
    rows_per_round = args.nodes * args.questions * args.generations
    print(
        f"{args.nodes} x {args.model} + LoRA r=16: generation of one swarm-round ({rows_per_round} rows: "
        f"{args.nodes} nodes x {args.questions} questions x {args.generations}, up to {args.max_new_tokens} new tokens), "
        f"median of {args.rounds} round(s)"
    )
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load at start "
        f"{os.getloadavg()[0]:.2f}; generation precision {args.generation_precision}; separate mode took "
        f"{separate_wall:.0f} s in all"
    )


def print_table(measured: Measured, modes: list, reserved: dict[str, int] | None) -> None:
    """One row per mode; on a GPU (`reserved` given) also its peak GPU memory and torch's reserve."""
    separate_memory, shared_memory = measured.separate_memory, measured.shared_memory
    rows = [["mode", "s per swarm-round", "x separate", "peak memory", "/ separate", "tokens per round"]]
    for name, seconds, memory, made in modes:
        rows.append(
            [
                name,
                f"{seconds:.2f}",
                f"{measured.separate_round / seconds:.2f}",
                f"{memory / 2**30:.2f} GiB",
                f"{memory / separate_memory.peak:.2f}",
                f"{made:.0f}",
            ]
        )
    if reserved is not None:  # on a GPU the card's memory is what a swarm runs out of
        memories = [separate_memory.gpu_peak, shared_memory.gpu_peak, shared_memory.gpu_peak]
        rows[0] += ["peak GPU memory", "/ separate", "torch reserved"]
        for row, memory, kind in zip(rows[1:], memories, ("separate", "shared", "shared")):
            row += [
                f"{memory / 2**30:.2f} GiB",
                f"{memory / max(separate_memory.gpu_peak, 1):.2f}",
                f"{reserved[kind] / 2**30:.2f} GiB",
            ]
    print_rows(rows)


def json_records(
    args, measured: Measured, modes: list, reserved: dict[str, int] | None, sampled: int | None
) -> list[dict]:
    """One record per mode, for --json."""
    gpu = reserved is not None
    records = []
    for (name, seconds, memory, made), mode in zip(modes, ("separate", "shared_one_by_one", "shared_mixed")):
        kind = "separate" if mode == "separate" else "shared"
        records.append(
            {
                "mode": mode,
                "label": name,
                "model": args.model,
                "device": args.device,
                "nodes": args.nodes,
                "rows_per_round": args.nodes * args.questions * args.generations,
                "seconds_per_round": seconds,
                "speedup_vs_separate": measured.separate_round / seconds,
                "peak_rss_bytes": memory,
                "rss_vs_separate": memory / measured.separate_memory.peak,
                "tokens_per_round": made,
                "peak_gpu_bytes": (measured.separate_memory if kind == "separate" else measured.shared_memory).gpu_peak
                if gpu
                else None,
                "torch_reserved_bytes": reserved[kind] if gpu else None,
                "gpu_memory_source": None if not gpu else "nvml" if sampled is not None else "torch reserved",
            }
        )
    if gpu:
        for record in records:
            record["gpu_vs_separate"] = record["peak_gpu_bytes"] / max(measured.separate_memory.gpu_peak, 1)
    return records
