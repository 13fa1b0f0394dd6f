"""Gossip N nodes' rollout groups over the real network (protocol/network.py) on 127.0.0.1.

By default all N nodes run in this one trio process (one libp2p host each, its own Ed25519
identity from `protocol.identity` in a temp dir), so every number here is N nodes sharing one
Python interpreter: latency includes waiting for the other nodes' work, and the CPU figure is
the whole swarm's. With `--processes` each node is its own OS process (this script, re-run as
a child), as in a real swarm. Nodes connect in a star (every node dials node 0, the bootstrap
peer) or a chain (node i dials node i-1); with `--discovery on` (the node's default) they also
find and dial each other through `/sapo/peers/1` (protocol/exchange/discovery.py), `off` keeps only the
bootstrap links, and `both` runs the swarm twice and prints the two side by side.

Every node publishes `--groups-per-round` real RolloutGroup frames (`to_wire` + `encode`, as
`node.exchange.GroupEncoder.frame` does) every `--round-seconds`, each node at its own phase in the
round. A group is one easy basic_arithmetic question with 8 completions of about 1,000
characters of reasoning-like text ending in <answer>N</answer>. Receivers decode every frame
with the real codec (bounded, validated), as a node's intake does before its checks.

    .venv/bin/python -m bench.gossip                 # 8 nodes, 30 s
    .venv/bin/python -m bench.gossip --nodes 3 --topology chain
    .venv/bin/python -m bench.gossip --nodes 16 --processes --discovery both
    .venv/bin/python -m bench.gossip --smoke         # 3 nodes, 5 s

Latency is from just before `publish()` to the receiving node's `received_at` (the same
clock: time.time() on one machine). Delivery ratio = delivered / (published x (N - 1)); after the last publish the
nodes get `--drain-seconds` to finish delivering.

This file is the command line; the groups are bench/gossip_groups.py's, the one-process swarm
bench/gossip_swarm.py's, the one-process-per-node launcher bench/gossip_processes.py's and the
tables bench/gossip_report.py's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import trio

from bench.gossip_processes import child_main, run_processes
from bench.gossip_report import print_comparison, print_report
from bench.gossip_swarm import run_swarm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8, help="number of nodes (hosts) in this process")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the nodes publish")
    parser.add_argument("--groups-per-round", type=int, default=4, help="groups each node publishes per round")
    parser.add_argument("--round-seconds", type=float, default=2.0, help="seconds between a node's rounds")
    parser.add_argument("--topology", choices=("star", "chain"), default="star", help="who dials whom")
    parser.add_argument("--settle-seconds", type=float, default=3.0, help="wait after connecting, for the mesh")
    parser.add_argument(
        "--drain-seconds", type=float, default=5.0, help="max wait for deliveries after the last publish"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated text")
    parser.add_argument("--processes", action="store_true", help="each node in its own OS process")
    parser.add_argument(
        "--discovery",
        choices=("on", "off", "both"),
        default="on",
        help="peer discovery (/sapo/peers/1) on, off, or one run of each, compared",
    )
    parser.add_argument(
        "--discover-peers",
        type=int,
        default=4,
        help="with discovery on: dial until this many peers are connected (the node's default)",
    )
    parser.add_argument("--smoke", action="store_true", help="3 nodes for 5 s: a quick check that this runs")
    # internal: the child side of --processes
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-dir", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.seconds, args.settle_seconds, args.drain_seconds = 3, 5.0, 2.0, 3.0
    if args.nodes < 2:
        parser.error(f"--nodes must be >= 2 (someone has to receive), got {args.nodes}")
    if args.seconds <= 0 or args.round_seconds <= 0 or args.groups_per_round < 1:
        parser.error("--seconds and --round-seconds must be > 0 and --groups-per-round >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child_main(args)
    runs = {"on": [True], "off": [False], "both": [False, True]}[args.discovery]
    results = []
    for discover in runs:
        if args.processes:
            try:
                result = run_processes(args, discover)
            except (TimeoutError, RuntimeError, subprocess.TimeoutExpired) as error:
                print(f"gossip benchmark failed: {error}", file=sys.stderr)
                return 1
        else:
            budget = 60 + args.settle_seconds + args.seconds + args.drain_seconds + 2 * args.nodes
            try:
                result = trio.run(_bounded, run_swarm, args, discover, budget)
            except trio.TooSlowError:
                print(f"gossip benchmark did not finish within {budget:.0f} s", file=sys.stderr)
                return 1
        print_report(args, result)
        results.append(result)
    if len(results) > 1:
        print_comparison(args, results)
    return 0


async def _bounded(fn, args, discover: bool, seconds: float):
    with trio.fail_after(seconds):
        return await fn(args, discover)


if __name__ == "__main__":
    sys.exit(main())
