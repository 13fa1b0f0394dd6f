"""Gossip between peers that are all behind NAT: relayed, and after hole punching.

One public namespace holds the bootstrap node, which relays (relay "auto": it finds itself
public) but gossips another topic, so it forwards none of the swarm's messages itself: every
group travels between NATed peers, over relayed circuits or hole-punched direct connections.
Each of `--nated` peers sits behind its own home router (bench/nat_topology.py: masquerade, no
port forwarding, unsolicited packets dropped), runs the real network (protocol/network.py) in its own OS process
(bench/gossip_peer.py) and publishes `--rate` real RolloutGroup frames a second.

Two runs, compared side by side:
  relayed      hole punching off: every peer-to-peer link stays a relayed circuit;
  punched      hole punching on (the default): the run waits until the punched links have
               replaced their relayed legs (DCUtR closes those 60 s after the direct one is up)
               and then measures; links that could not be punched stay relayed.
`--symmetric K` puts K of the peers behind symmetric NATs, which no hole punch gets through.

Both runs start measuring only once the peers form one connected swarm (each has a link to
another NATed peer and there are no islands). Delivery = groups received / (published x (N-1)),
latency from just before publish() to the receiver's arrival time (one machine, one clock).

    sudo .venv/bin/python -m bench.nat                      # 16 NATed peers, 0.5 groups/s each, 60 s
    sudo .venv/bin/python -m bench.nat --nated 8 --seconds 30 --runs punched
    sudo .venv/bin/python -m bench.nat --smoke              # 3 peers, 10 s, both runs
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.gossip_peer import PeerProcess, write_groups
from bench.gossip_swarm import percentile
from bench.nat_topology import NatTopology, missing

RELAY_ONLY_SWARM = "relay-only"  # the bootstrap's own swarm (topic): it carries none of the swarm's groups
START_SECONDS_PER_PEER = 15.0
PUNCH_SETTLE_SECONDS = 75.0  # a child imports libp2p: on 2 busy cores 17 of them take a while


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nated", type=int, default=16, help="peers, each behind its own NAT")
    parser.add_argument("--rate", type=float, default=0.5, help="groups each peer publishes per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the peers publish")
    parser.add_argument("--drain-seconds", type=float, default=10.0, help="wait for deliveries after the last publish")
    parser.add_argument("--runs", default="relayed,punched", help="which runs: relayed, punched or both")
    parser.add_argument("--symmetric", type=int, default=0, help="how many peers sit behind symmetric NATs")
    parser.add_argument(
        "--swarm-timeout", type=float, default=180.0, help="give up if no connected swarm forms in this long"
    )
    parser.add_argument(
        "--punch-timeout",
        type=float,
        default=150.0,
        help="punched run: wait at most this long for relayed legs of punched links to close",
    )
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy every peer's log and events here")
    parser.add_argument("--smoke", action="store_true", help="3 peers, 10 s: a quick check that this runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nated, args.seconds, args.drain_seconds, args.punch_timeout = 3, 10.0, 5.0, 90.0
    args.runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if not set(args.runs) <= {"relayed", "punched"} or not args.runs:
        parser.error(f"--runs takes relayed and/or punched, got {args.runs}")
    if args.nated < 2:
        parser.error("--nated must be >= 2")
    return args


def links(peers: list[PeerProcess]) -> dict[str, dict[str, str]]:
    """peer id -> {NATed peer id: direct | relayed | both}, from each peer's latest state line."""
    ids = {p.peer_id for p in peers}
    out = {}
    for p in peers:
        state = p.last_state() or {"conns": {}}
        out[p.peer_id] = {other: kind for other, kind in state["conns"].items() if other in ids}
    return out


def one_swarm(graph: dict[str, dict[str, str]]) -> bool:
    """Every peer linked to another, and all of them reachable from the first."""
    if any(not neighbours for neighbours in graph.values()):
        return False
    start = next(iter(graph))
    seen, todo = {start}, [start]
    while todo:
        for other in graph[todo.pop()]:
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return len(seen) == len(graph)


def link_kinds(graph: dict[str, dict[str, str]]) -> dict[str, int]:
    """How many distinct peer-to-peer links are direct, relayed, or both (punched, relay leg still open)."""
    kinds: dict[tuple[str, str], str] = {}
    for peer, neighbours in graph.items():
        for other, kind in neighbours.items():
            kinds[tuple(sorted((peer, other)))] = kind  # either end's view; they agree but for a moment
    counts = {"direct": 0, "relayed": 0, "both": 0}
    for kind in kinds.values():
        counts[kind] += 1
    return counts


def wait_until(what: str, condition, timeout: float, peers: list[PeerProcess]) -> float:
    started = time.monotonic()
    while not condition():
        for p in peers:
            if not p.alive():
                raise RuntimeError(f"{p.name} exited: {p.log_tail()}")
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(1.0)
    return time.monotonic() - started


@dataclass
class SwarmRun:
    """What one run saw: who published what, who received what when, and the links."""

    published: dict[str, tuple[str, float]] = field(default_factory=dict)  # group id -> (author, sent at)
    received: dict[str, dict[str, float]] = field(default_factory=dict)  # peer id -> {group id: arrived at}
    names: dict[str, str] = field(default_factory=dict)  # peer id -> process name
    before: dict[str, int] = field(default_factory=dict)  # link kinds when publishing started
    after: dict[str, int] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    states: dict[str, dict] = field(default_factory=dict)  # name -> last state line
    cpu: dict[str, float] = field(default_factory=dict)  # name -> cores while publishing

    def missing(self, peer_id: str) -> set[str]:
        """Groups of the other peers that `peer_id` never received."""
        expected = {g for g, (author, _) in self.published.items() if author != peer_id}
        return expected - set(self.received.get(peer_id, {}))

    def latencies(self) -> list[float]:
        return [
            at - self.published[g][1]
            for peer, got in self.received.items()
            for g, at in got.items()
            if g in self.published and self.published[g][0] != peer
        ]


def all_linked(peers: list[PeerProcess]) -> bool:
    """Every peer linked to every other (what discover_peers gives a swarm smaller than it)."""
    return all(len(neighbours) == len(peers) - 1 for neighbours in links(peers).values())


def start_nated_peers(
    tmp: Path,
    topo: NatTopology,
    *,
    nated: int,
    rate: float,
    hole_punching: bool,
    bootstrap: str,
    groups: Path,
    fetch: int = 0,
) -> list[PeerProcess]:
    """The `nated` peers, each in its own NATed namespace, waiting for `go` to publish (with
    `fetch`, offering their groups to be fetched and asking for that many a second)."""
    return [
        PeerProcess(
            f"nat{i}",
            tmp / f"nat{i}",
            prefix=topo.prefix(topo.nated_ns[i]),
            peers=[bootstrap],
            rate=rate,
            index=i,
            groups_file=groups,
            wait_go=True,
            settings={"hole_punching": hole_punching},
            fetch=fetch,
        )
        for i in range(nated)
    ]


def settle_punched_links(out: SwarmRun, peers: list[PeerProcess], everyone: list[PeerProcess], timeout: float) -> None:
    """DCUtR tries each relayed link within seconds, and GossipSub keeps using the relayed
    leg until DCUtR closes it, 60 s after the punch: give it that, then wait for the
    last legs to close."""
    time.sleep(PUNCH_SETTLE_SECONDS)
    try:
        out.phases["relay legs closed s"] = (
            wait_until(
                "punched links to drop their relayed legs",
                lambda: link_kinds(links(peers))["both"] == 0 and one_swarm(links(peers)),
                timeout,
                everyone,
            )
            + PUNCH_SETTLE_SECONDS
        )
    except TimeoutError:
        out.phases["relay legs closed s"] = float("nan")  # measured anyway; the link counts show it


def publish_and_measure(
    out: SwarmRun, peers: list[PeerProcess], everyone: list[PeerProcess], seconds: float, drain: float
) -> None:
    """Every NATed peer publishes for `seconds`, then `drain` more to deliver: the links before
    and after, each process's last state and the cores it used meanwhile."""
    out.before = link_kinds(links(peers))
    cpu_before = {p.name: (p.last_state() or {}).get("cpu", 0.0) for p in everyone}
    go = time.time() + 2.0
    for p in peers:
        p.go(go, seconds)
    time.sleep(2.0 + seconds + drain)
    out.after = link_kinds(links(peers))
    out.states = {p.name: p.last_state() or {} for p in everyone}
    measured = 2.0 + seconds + drain
    out.cpu = {name: (state.get("cpu", 0.0) - cpu_before[name]) / measured for name, state in out.states.items()}


def record_events(out: SwarmRun, peers: list[PeerProcess], everyone: list[PeerProcess]) -> None:
    """Who published which group when, and who received it when, from the processes' event lines."""
    out.published = {e["id"]: (p.peer_id, e["at"]) for p in peers for e in p.of("pub") if e.get("ok")}
    out.received = {p.peer_id: {e["id"]: e["at"] for e in p.of("recv")} for p in everyone}
    out.names = {p.peer_id: p.name for p in everyone}


def run_swarm(
    *,
    nated: int,
    rate: float,
    seconds: float,
    drain: float = 10.0,
    symmetric: frozenset[int] = frozenset(),
    hole_punching: bool = True,
    relay: str = "auto",
    ready=None,
    ready_timeout: float = 180.0,
    settle_punches: bool = False,
    punch_timeout: float = 150.0,
    keep_logs: Path | None = None,
    fetch: int = 0,
) -> SwarmRun:
    """One public bootstrap (relaying per `relay`, gossiping another topic) and `nated` peers
    behind NAT; waits for `ready(peers)` (default: one connected swarm), with `settle_punches`
    also for DCUtR to replace the relayed legs, then every peer publishes `rate` groups/s for
    `seconds` and gets `drain` more to deliver. With `fetch`, the peers fetch groups (0.4.0's way)
    instead of gossiping them: each asks for `fetch` a second."""
    ready = ready or (lambda peers: one_swarm(links(peers)))
    out = SwarmRun()
    tag = f"nb{os.getpid() % 10000}{'p' if hole_punching else 'r'}"
    with (
        tempfile.TemporaryDirectory(prefix="sapo-bench-nat-") as tmp,
        NatTopology(tag, public=1, nated=nated, symmetric=symmetric) as topo,
    ):
        tmp = Path(tmp)
        groups = write_groups(tmp / "groups.json")
        started = time.monotonic()
        boot = PeerProcess(
            "bootstrap",
            tmp / "bootstrap",
            prefix=topo.prefix(topo.public_ns[0]),
            rate=0,
            settings={"swarm": RELAY_ONLY_SWARM, "relay": relay},
            groups_file=groups,
        )
        everyone = [boot]
        try:
            boot_id = boot.wait_up(60 + START_SECONDS_PER_PEER)
            bootstrap = f"/ip4/{topo.public_ip[0]}/tcp/4001/p2p/{boot_id}"
            peers = start_nated_peers(
                tmp,
                topo,
                nated=nated,
                rate=rate,
                hole_punching=hole_punching,
                bootstrap=bootstrap,
                groups=groups,
                fetch=fetch,
            )
            everyone += peers
            for p in peers:
                p.wait_up(60 + START_SECONDS_PER_PEER * nated)
            out.phases["start s"] = time.monotonic() - started
            out.phases["ready s"] = wait_until("the peers to be ready", lambda: ready(peers), ready_timeout, everyone)
            if settle_punches:
                settle_punched_links(out, peers, everyone, punch_timeout)
            else:
                time.sleep(3.0)  # a few GossipSub heartbeats: the mesh takes in the new links
            publish_and_measure(out, peers, everyone, seconds, drain)
        finally:
            for p in everyone:
                p.stop()
            if keep_logs is not None:
                shutil.copytree(tmp, keep_logs / tag, ignore=shutil.ignore_patterns("identity.key"), dirs_exist_ok=True)
    record_events(out, peers, everyone)
    return out


def measure(args: argparse.Namespace, run: str) -> dict:
    """One bench run ("relayed" or "punched") summarised for print_report."""
    r = run_swarm(
        nated=args.nated,
        rate=args.rate,
        seconds=args.seconds,
        drain=args.drain_seconds,
        symmetric=frozenset(range(args.symmetric)),
        hole_punching=run == "punched",
        ready_timeout=args.swarm_timeout,
        settle_punches=run == "punched",
        punch_timeout=args.punch_timeout,
        keep_logs=args.keep_logs,
    )
    peer_ids = [peer for peer, name in r.names.items() if name != "bootstrap"]
    counters: dict[str, int] = {}
    for state in r.states.values():
        for name, value in state.get("counters", {}).items():
            counters[name] = counters.get(name, 0) + value
    peer_cpu = [c for name, c in r.cpu.items() if name != "bootstrap"]
    delivered = sum(1 for peer in peer_ids for g in r.received[peer] if g in r.published and r.published[g][0] != peer)
    return {
        "run": run,
        "published": len(r.published),
        "expected": len(r.published) * (args.nated - 1),
        "delivered": delivered,
        "latencies": r.latencies(),
        "before": r.before,
        "after": r.after,
        "phases": r.phases,
        "counters": counters,
        "reachability": [r.states[r.names[p]].get("reachability") for p in peer_ids],
        "relaying": r.states["bootstrap"].get("relaying"),
        "cpu_bootstrap": r.cpu["bootstrap"],
        "cpu_peer_mean": sum(peer_cpu) / len(peer_cpu),
        "cpu_peer_max": max(peer_cpu),
    }


def print_report(args: argparse.Namespace, results: list[dict]) -> None:
    load = os.getloadavg()[0]
    print()
    print(
        f"NAT benchmark: {args.nated} peers each behind its own NAT ({args.symmetric} symmetric), one public "
        f"bootstrap relaying (not gossiping the topic), {args.rate:g} groups/s per peer for {args.seconds:g} s; "
        f"{os.cpu_count()} CPUs, load average {load:.1f} at the end"
    )
    print(
        f"{'run':<9} {'delivered / expected':>22} {'ratio':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}   "
        f"links direct/relayed/both at start -> end   setup"
    )
    for r in results:
        ratio = r["delivered"] / r["expected"] if r["expected"] else 0.0
        p50, p99, p100 = (1e3 * percentile(r["latencies"], q) for q in (50, 99, 100))
        b, a = r["before"], r["after"]
        setup = ", ".join(f"{k} {v:.0f}" for k, v in r["phases"].items())  # ready = one connected swarm
        print(
            f"{r['run']:<9} {str(r['delivered']) + ' / ' + str(r['expected']):>22} {ratio:7.4f} {p50:8.1f} {p99:8.1f} "
            f"{p100:8.1f}   {b['direct']}/{b['relayed']}/{b['both']} -> {a['direct']}/{a['relayed']}/{a['both']}"
            f"{'':>14}{setup}"
        )
    for r in results:
        c = r["counters"]
        keys = (
            "relay_reserved",
            "relay_dials",
            "relay_dial_failed",
            "relay_circuits_served",
            "relay_refused",
            "reachability_checks",
            "autonat_served",
            "autonat_refused",
            "discovery_connected",
            "publish_dropped",
        )
        print(
            f"  {r['run']}: CPU while measuring (cores): bootstrap {r['cpu_bootstrap']:.2f}, peers mean "
            f"{r['cpu_peer_mean']:.2f} max {r['cpu_peer_max']:.2f}"
        )
        print(
            f"  {r['run']}: bootstrap relaying={r['relaying']}, peers' reachability "
            f"{dict((s, r['reachability'].count(s)) for s in set(r['reachability']))}; "
            + ", ".join(f"{k}={c.get(k, 0)}" for k in keys)
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = missing()
    if reason:
        print(f"NAT benchmark cannot run here: {reason}", file=sys.stderr)
        return 2
    results = []
    for run in args.runs:
        try:
            results.append(measure(args, run))
        except (TimeoutError, RuntimeError) as error:
            print(f"NAT benchmark ({run}) failed: {error}", file=sys.stderr)
            return 1
    print_report(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
