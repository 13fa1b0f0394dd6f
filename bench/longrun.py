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

    .venv/bin/python -m bench.longrun                          # 2 hours, into bench/results/longrun-<time>
    nice -n 5 .venv/bin/python -m bench.longrun --minutes 20 --note "what else ran"
    .venv/bin/python -m bench.longrun --from bench/results/longrun-<time>  # table, plot, verdicts again
    .venv/bin/python -m bench.longrun --smoke                  # the tiny model, 30 s, 3 s samples

Any other flag is a node setting passed to every node (as `sapo-node swarm` does).

This file is the command line; the swarm and its sampling are bench/longrun_swarm.py's, the
bounds bench/longrun_verdicts.py's, the table and plot bench/longrun_report.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.longrun_report import report
from bench.longrun_swarm import ROOT, run

# RUN_ARGS of the Makefile (`make run`), less --nodes and --data-dir, which the bench sets.
MAKE_RUN_ARGS = [
    "--model",
    "smollm2-135m",
    "--lora",
    "--tasks",
    "basic_arithmetic",
    "--local",
    "2",
    "--external",
    "2",
    "--max-new-tokens",
    "128",
]
SMOKE_ARGS = [
    "--model",
    "tiny",
    "--tasks",
    "basic_arithmetic",
    "--local",
    "2",
    "--external",
    "2",
    "--max-new-tokens",
    "24",
    "--generations",
    "4",
    "--warm-start-steps",
    "0",
    "--checkpoint-every",
    "2",
]


def keep_checkpoints(node_args: list[str]) -> int:
    from sapo.node.flags import node_settings_from_flags

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
    parser.add_argument(
        "--warmup-minutes",
        type=float,
        default=None,
        help="samples before this are not judged (default: 15, or a quarter of a shorter run, or "
        "a node's first checkpoint if later; with --from, judge again from another minute)",
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="results dir (default: bench/results/longrun-<time>)")
    parser.add_argument(
        "--from", dest="from_dir", type=Path, default=None, help="re-render an earlier run's table, plot and verdicts"
    )
    parser.add_argument(
        "--table-minutes", type=float, default=None, help="table rows every this many minutes (default: 10)"
    )
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
        "nodes": args.nodes,
        "node_args": node_args,
        "minutes": args.minutes,
        "interval": args.interval,
        "warmup_minutes": warmup,
        "warmup_given": args.warmup_minutes is not None,
        "keep_checkpoints": keep_checkpoints(node_args),
        "log_cap_bytes": log_cap_bytes(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": git_commit(),
        "cpus": os.cpu_count(),
        "load_at_start": os.getloadavg()[0],
        "note": args.note,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"long run into {out}: {args.nodes} nodes, {' '.join(node_args)}, {args.minutes:g} min", flush=True)
    run(out, meta)
    return report(out, args.table_minutes or (1.0 if args.smoke else 10.0))


if __name__ == "__main__":
    sys.exit(main())
