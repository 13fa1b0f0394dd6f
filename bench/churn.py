"""Churn: a swarm on 127.0.0.1 where a node leaves and another joins every `--every` seconds.

`--nodes` gossip peers (bench/gossip_peer.py: the node's real network (protocol/network.py), publishing real
RolloutGroup frames, no model) run as OS processes and publish `--rate` groups a second each.
Every `--every` seconds a random node leaves, alternately gracefully (SIGTERM: it closes its
host) and by crashing (SIGKILL), and a new node with a new identity joins, bootstrapping from
three random nodes that are up (so the first bootstrap node may leave too). Training nodes
would add minutes of model work per round and nothing network-wise; 12 of them do not fit on
two cores.

Delivery counts only what a node could have received: a group published at time t by A is
expected at every other node that had joined (first connected, plus `--settle` seconds for the
mesh to take it in) before t and was still up at t + `--grace`. A node that stops without
being told to (a crash, a hang) fails the run.

    .venv/bin/python -m bench.churn                         # 12 nodes, churn every 20 s for 3 min
    .venv/bin/python -m bench.churn --nodes 6 --every 10 --minutes 0.75
    .venv/bin/python -m bench.churn --smoke
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.gossip_peer import PeerProcess, write_groups
from bench.gossip_swarm import percentile

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=12, help="nodes up at any time")
    parser.add_argument("--every", type=float, default=20.0, help="seconds between one leaving and one joining")
    parser.add_argument("--minutes", type=float, default=3.0, help="how long the churn lasts")
    parser.add_argument("--rate", type=float, default=0.5, help="groups each node publishes per second")
    parser.add_argument("--grace", type=float, default=10.0, help="a group must reach nodes up this long after it")
    parser.add_argument("--settle", type=float, default=3.0, help="a joiner counts this long after its first link")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="4 nodes, churn every 6 s for 20 s")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.every, args.minutes = 4, 6.0, 20 / 60
    if args.nodes < 3:
        parser.error("--nodes must be >= 3")
    return args


@dataclass
class Member:
    process: PeerProcess
    how_it_left: str = ""  # "", "term" or "kill"
    joined_at: float | None = None  # time.time() of its first link + settle
    left_at: float | None = None

    def present(self, t: float, grace: float) -> bool:
        return (
            self.joined_at is not None and self.joined_at <= t and (self.left_at is None or t + grace <= self.left_at)
        )


class Swarm:
    def __init__(self, args: argparse.Namespace, tmp: Path):
        self.args, self.tmp = args, tmp
        self.groups = write_groups(tmp / "groups.json")
        self.members: list[Member] = []
        self.rng = random.Random(args.seed)

    def up(self) -> list[Member]:
        return [m for m in self.members if m.left_at is None]

    def join(self, bootstrap: list[str]) -> Member:
        index = len(self.members)
        process = PeerProcess(
            f"node{index}",
            self.tmp / f"node{index}",
            listen=LOOPBACK,
            peers=bootstrap,
            rate=self.args.rate,
            index=index,
            groups_file=self.groups,
        )
        member = Member(process)
        self.members.append(member)
        return member

    def address(self, member: Member) -> str:
        up = member.process.of("up")
        return up[0]["listen"][0]

    def watch(self) -> None:
        """Note joins (first link + settle) and nodes that died on their own."""
        for m in self.up():
            p = m.process
            state = p.last_state()
            if m.joined_at is None and state and state["conns"]:
                m.joined_at = state["t"] + self.args.settle
            if not p.alive():
                raise RuntimeError(f"{p.name} stopped on its own (exit {p.proc.returncode}): {p.log_tail()}")

    def leave(self, member: Member, how: str) -> None:
        member.how_it_left = how
        member.left_at = time.time()
        if how == "kill":
            member.process.proc.send_signal(signal.SIGKILL)
            member.process.proc.wait(10)
        code = member.process.stop()
        if how == "term" and code != 0:
            raise RuntimeError(
                f"{member.process.name} did not leave cleanly (exit {code}): {member.process.log_tail()}"
            )


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="sapo-bench-churn-") as tmp:
        swarm = Swarm(args, Path(tmp))
        try:
            first = swarm.join([])
            first.process.wait_up(90)
            for _ in range(args.nodes - 1):
                swarm.join([swarm.address(first)])
            for m in swarm.members:
                m.process.wait_up(60 + 10 * args.nodes)
            deadline = time.monotonic() + 60 + 5 * args.nodes
            while any(m.joined_at is None for m in swarm.members):
                swarm.watch()
                if time.monotonic() > deadline:
                    raise TimeoutError("the first nodes did not all link up")
                time.sleep(0.5)
            started = time.time()
            cycles = int(args.minutes * 60 / args.every)
            for cycle in range(cycles):
                next_at = started + (cycle + 1) * args.every
                while time.time() < next_at:
                    swarm.watch()
                    time.sleep(0.5)
                leaver = swarm.rng.choice(swarm.up())
                swarm.leave(leaver, "term" if cycle % 2 == 0 else "kill")
                present = [m for m in swarm.up() if m.joined_at is not None]
                bootstrap = [swarm.address(m) for m in swarm.rng.sample(present, min(3, len(present)))]
                swarm.join(bootstrap)  # it counts once it has linked up (watch)
            ended = time.time() + args.grace
            while time.time() < ended:
                swarm.watch()
                time.sleep(0.5)
            stayed = swarm.up()
        finally:
            for m in swarm.up():
                m.left_at = m.left_at or time.time()
                m.process.stop()
    return score(args, swarm, started, ended - args.grace, stayed)


def score(args: argparse.Namespace, swarm: Swarm, started: float, ended: float, stayed: list[Member]) -> dict:
    """Delivery to present nodes of every group published during the churn."""
    received = {id(m): {e["id"]: e["at"] for e in m.process.of("recv")} for m in swarm.members}
    expected = delivered = 0
    latencies: list[float] = []
    missed_by: dict[str, int] = {}
    for author in swarm.members:
        for pub in author.process.of("pub"):
            t = pub["at"]
            if not pub["ok"] or not started <= t <= ended:
                continue
            for m in swarm.members:
                if m is author or not m.present(t, args.grace):
                    continue
                expected += 1
                at = received[id(m)].get(pub["id"])
                if at is None:
                    missed_by[m.process.name] = missed_by.get(m.process.name, 0) + 1
                else:
                    delivered += 1
                    latencies.append(at - t)
    return {
        "expected": expected,
        "delivered": delivered,
        "latencies": latencies,
        "missed_by": missed_by,
        "joined": len(swarm.members) - args.nodes,
        "left": sum(1 for m in swarm.members if m.how_it_left),
        "killed": sum(1 for m in swarm.members if m.how_it_left == "kill"),
        "stayed": len(stayed),
        "seconds": ended - started,
    }


def print_report(args: argparse.Namespace, r: dict) -> None:
    ratio = r["delivered"] / r["expected"] if r["expected"] else 0.0
    p50, p99, p100 = (1e3 * percentile(r["latencies"], q) for q in (50, 99, 100))
    print()
    print(
        f"churn benchmark: {args.nodes} nodes on 127.0.0.1 (gossip peers, real network (protocol/network.py)), one leaves and "
        f"one joins every {args.every:g} s for {r['seconds']:.0f} s, {args.rate:g} groups/s per node; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end"
    )
    print(
        f"left {r['left']} ({r['killed']} by SIGKILL, the rest SIGTERM), joined {r['joined']}, "
        f"up at the end {r['stayed']}; no node stopped on its own"
    )
    print(
        f"delivered to present nodes: {r['delivered']} / {r['expected']} = {ratio:.4f}; "
        f"latency p50 / p99 / max {p50:.0f} / {p99:.0f} / {p100:.0f} ms"
    )
    if r["missed_by"]:
        print("missed, by receiver: " + ", ".join(f"{k} {v}" for k, v in sorted(r["missed_by"].items())))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except (TimeoutError, RuntimeError) as error:
        print(f"churn benchmark failed: {error}", file=sys.stderr)
        return 1
    print_report(args, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
