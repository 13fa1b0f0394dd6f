"""A swarm of thousands (issue #31): a node's network cost against swarm size, gossip against fetch.

Real swarms of N node networks (`open_network`, discovery on, a few seeds) in one trio process
(scale_swarm.py), before (`exchange="gossip"`: every group to every node on the rollouts topic)
and after (`exchange="fetch"`: each round a node asks `want` authors drawn uniformly for their
newest group). Every node shares `--groups-per-round` real RolloutGroup frames a round, each at
its own phase, and wants `groups_wanted(J)` (node/core/exchange.py: J and a margin). Per node and
per second, at make run's pace (2 groups a node every 10 s): inbound bytes and CPU, from an idle
phase (per second) and the rounds (per round), so a round shorter or longer than 10 s (time is
scaled to fit 2 cores) still gives the cost a node pays at make run's pace. Then the share of
rounds in which a node got at least J new external groups, and the distinct authors it heard.

scale_model.py fits a cost model to these rows (per delivered group, per fetch, per dial, per
second) and extrapolates to 1,000 and 10,000 nodes; scale_report.py prints the table and draws
the figure from the rows alone.

    nice -n 5 .venv/bin/python -m bench.scale                           # the sweep: 8-64 nodes, both modes
    .venv/bin/python -m bench.scale --sizes 128 --modes fetch          # appended to the same rows
    .venv/bin/python -m bench.scale --report                            # table, model, figure from the rows
    .venv/bin/python -m bench.scale --smoke                             # 4 and 6 nodes, both modes, < 60 s
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import trio

from bench.scale_swarm import Plan, load_average, run_scale, say

OUT = Path(__file__).resolve().parent / "results" / "scale"
MODES = {"before": "gossip", "after": "fetch"}


@dataclass
class ScaleRow:
    """One run: its plan, where and when it ran, and what scale_swarm.run_scale measured."""

    plan: dict
    result: dict
    load_before: float
    load_after: float
    commit: str
    dirty: bool
    started: str
    command: str
    machine: str


def round_seconds(mode: str, nodes: int, args: argparse.Namespace) -> float:
    """The round used for `nodes`: the whole swarm's work in one process grows with N for fetch and
    with N^2 for gossip (every node receives every group), so rounds stretch with it to keep the
    process under about 0.6 of a core (costs are then given per round-equivalent); never shorter
    than --round-seconds."""
    grows = args.gossip_round_per_node2 * nodes**2 if mode == "gossip" else args.fetch_round_per_node * nodes
    return round(max(args.round_seconds, grows), 1)


def plan_for(mode: str, nodes: int, args: argparse.Namespace) -> Plan:
    from sapo.node.core.exchange import groups_wanted
    from sapo.protocol.exchange.group_fetch import GROUPS_PER_AUTHOR

    return Plan(
        mode=mode,
        nodes=nodes,
        seeds=min(args.seeds, nodes),
        round_s=round_seconds(mode, nodes, args),
        groups_per_round=args.groups_per_round,
        want=groups_wanted(args.j),
        warmup_rounds=args.warmup_rounds if args.warmup_rounds is not None else (1 if mode == "gossip" else 3),
        rounds=args.rounds if args.rounds is not None else (3 if mode == "gossip" else 12),
        settle_s=args.settle_seconds,
        idle_s=args.idle_seconds,
        discover_peers=args.discover_peers,
        seed=args.seed,
        groups_per_author=GROUPS_PER_AUTHOR if mode == "fetch" else 1,
    )


def git_state() -> tuple[str, bool]:
    root = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
    )
    return commit.stdout.strip(), bool(dirty.stdout.strip())


def run_one(plan: Plan, command: str) -> ScaleRow:
    load_before = load_average()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    commit, dirty = git_state()  # the code the run imports: the tree as it starts
    budget = 120 + plan.nodes + plan.settle_s + plan.idle_s + (plan.warmup_rounds + plan.rounds + 2) * plan.round_s
    result = trio.run(_bounded, plan, budget)
    machine = f"{platform.machine()}, {_cpus()} CPUs, python {platform.python_version()}"
    return ScaleRow(asdict(plan), result, load_before, load_average(), commit, dirty, started, command, machine)


async def _bounded(plan: Plan, seconds: float) -> dict:
    with trio.fail_after(seconds):
        return await run_scale(plan)


def _cpus() -> int:
    return os.cpu_count() or 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,16,32,64", help="swarm sizes, comma-separated")
    parser.add_argument("--modes", default="before,after", help="before (gossip), after (fetch), or both")
    parser.add_argument("--j", type=int, default=4, help="external groups a node trains on a round (J)")
    parser.add_argument("--groups-per-round", type=int, default=2, help="groups each node shares a round (make run: 2)")
    parser.add_argument("--round-seconds", type=float, default=4.0, help="shortest round; make run's is about 10 s")
    parser.add_argument(
        "--gossip-round-per-node2", type=float, default=0.018, help="gossip round: at least this x N^2 s"
    )
    parser.add_argument("--fetch-round-per-node", type=float, default=0.15, help="fetch round: at least this x N s")
    parser.add_argument("--warmup-rounds", type=int, default=None, help="rounds before measuring (fetch 3, gossip 1)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds measured (fetch 12, gossip 3: all arrive)")
    parser.add_argument("--settle-seconds", type=float, default=10.0, help="after connecting: discovery dials")
    parser.add_argument(
        "--idle-seconds", type=float, default=15.0, help="connected, publishing nothing: per-second costs"
    )
    parser.add_argument("--seeds", type=int, default=3, help="bootstrap nodes; every other node dials one")
    parser.add_argument("--discover-peers", type=int, default=4, help="discovery's target (the node's default: 4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated text")
    parser.add_argument("--out", type=Path, default=None, help=f"rows go to OUT/rows.jsonl, appended (default {OUT})")
    parser.add_argument("--report", action="store_true", help="only the table, model and figure from OUT's rows")
    parser.add_argument("--smoke", action="store_true", help="4 and 6 nodes, short rounds, into a temp dir: < 60 s")
    args = parser.parse_args(argv)
    args.size_list = [int(s) for s in args.sizes.split(",") if s]
    args.mode_list = [MODES.get(m, m) for m in args.modes.split(",") if m]
    if args.smoke:
        args.size_list, args.round_seconds, args.warmup_rounds, args.rounds = [4, 6], 1.0, 1, 2
        args.settle_seconds, args.idle_seconds, args.seeds = 1.5, 1.5, 2
    if any(m not in ("gossip", "fetch") for m in args.mode_list) or any(n < 3 for n in args.size_list):
        parser.error(f"--modes takes before/after (gossip/fetch), --sizes >= 3; got {args.modes!r}, {args.sizes!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="sapo-scale-smoke-")) if args.smoke else OUT
    if not args.report:
        args.out.mkdir(parents=True, exist_ok=True)
        command = shlex.join(["python", "-m", "bench.scale", *(sys.argv[1:] if argv is None else argv)])
        for nodes in args.size_list:
            for mode in args.mode_list:
                plan = plan_for(mode, nodes, args)
                try:
                    row = run_one(plan, command)
                except trio.TooSlowError:
                    say(f"{mode} N={nodes} did not finish in time; no row")
                    return 1
                with (args.out / "rows.jsonl").open("a") as rows:
                    rows.write(json.dumps(asdict(row)) + "\n")
                say(f"{mode} N={nodes}: row written (load {row.load_before} -> {row.load_after})")
    from bench.scale_report import report  # after the runs: a report bug must not cost a sweep's rows

    return report(args.out, j=args.j, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
