"""One run of the scale benchmark (bench/scale.py): N real node networks in one trio process.

Every node is `open_network` (protocol/network.py) on 127.0.0.1 with its own Ed25519 identity.
A few seeds are every node's bootstrap list, and discovery dials beyond them up to its target,
so the topology is not a star. Each node runs the exchange's round as the daemon does
(node/core/exchange.py, `GossipExchange.publish`): it shares its round's groups, then asks for
`want` groups; `exchange` in the settings decides whether they travel by gossip or by fetch.
Every received frame is decoded with the real codec, as a node's intake does first.

What is measured, for the whole process and divided by N afterwards (scale_model.py):
- CPU: `time.process_time()`, less the CPU spent building our own frames (not network work);
  decoding received frames is kept in, since a node pays it for every group it is sent.
- inbound bytes: every byte libp2p reads from its TCP sockets (TrioTCPStream.read, wrapped
  here): Noise, yamux, gossip, fetches, discovery and identify, without TCP/IP headers. In one
  process each byte one node sends is read by another, so this is the swarm's inbound total.
- an idle phase (connected, nothing published) and an active phase (rounds, after a warm-up),
  so a per-second cost (heartbeats, discovery) can be told from a per-round one.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

from bench.gossip_groups import build_groups
from bench.gossip_swarm import BenchNode

# Bytes read from every libp2p TCP stream in this process (wrap_tcp_reads).
RX_BYTES = [0]


class LogTally(logging.Handler):
    """Counts warnings by logger and the start of their message, instead of printing thousands
    of them (py-libp2p logs each GRAFT it refuses); the counts go into the row."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[f"{record.name}: {record.getMessage()[:40]}"] += 1


def wrap_tcp_reads() -> None:
    """Count what libp2p reads off TCP; idempotent."""
    from libp2p.io.trio import TrioTCPStream

    if getattr(TrioTCPStream.read, "counted", False):
        return
    original = TrioTCPStream.read

    async def read(self, n: int | None = None) -> bytes:
        data = await original(self, n)
        RX_BYTES[0] += len(data)
        return data

    read.counted = True  # type: ignore[attr-defined]
    TrioTCPStream.read = read  # type: ignore[method-assign]


@dataclass
class Plan:
    mode: str  # "gossip" (before) or "fetch" (after): NetworkSettings.exchange
    nodes: int
    seeds: int
    round_s: float
    groups_per_round: int
    want: int
    warmup_rounds: int
    rounds: int  # measured, after the warm-up
    settle_s: float
    idle_s: float
    discover_peers: int
    seed: int = 0
    # groups the fetcher asks of each drawn author (group_fetch.GROUPS_PER_AUTHOR when the row was
    # made; rows from before it was 2 lack it and asked for 1)
    groups_per_author: int = 1


@dataclass
class NodeTally:
    """What one node received: each new external group once, by round and by author."""

    seen: set[bytes] = field(default_factory=set)
    new_in_round: int = 0
    per_round: list[int] = field(default_factory=list)  # new external groups before each round began
    authors: Counter = field(default_factory=Counter)  # author -> groups, measured rounds only
    measuring: bool = False
    duplicates: int = 0


@dataclass
class Tallies:
    build_cpu_s: float = 0.0
    decode_cpu_s: float = 0.0
    delivered: int = 0
    rejected: int = 0
    shared: int = 0
    share_failed: int = 0
    frame_bytes: list[int] = field(default_factory=list)


def snapshot(nets: list, tallies: Tallies) -> dict:
    counters: Counter = Counter()
    for net in nets:
        counters.update(net.counters)
    return {
        "wall": time.monotonic(),
        "cpu_s": time.process_time(),
        "waited_s": cpu_wait_seconds(),
        "rx_bytes": RX_BYTES[0],
        "build_cpu_s": tallies.build_cpu_s,
        "decode_cpu_s": tallies.decode_cpu_s,
        "delivered": tallies.delivered,
        "counters": dict(counters),
        "links": [len(net.connected_peers()) for net in nets],
        "known": [len(net.discovery.table) for net in nets],  # discovery's records: whom a fetch may draw
    }


def cpu_wait_seconds() -> float:
    """Seconds this process was ready to run but waited for a core (the kernel's schedstat).

    The process's CPU alone cannot tell a swarm that needs 0.4 of a core from one that needs a
    whole core and is given 0.4 by a busy machine (other sessions are their own autogroups, so
    `nice` does not protect the bench): the second one times out and cascades. With the wait,
    (CPU + wait) / wall is what the swarm asked for."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def delta(before: dict, after: dict) -> dict:
    """What happened between two snapshots; links as they were at the end."""
    keys = ("wall", "cpu_s", "waited_s", "rx_bytes", "build_cpu_s", "decode_cpu_s", "delivered")
    out = {k: after[k] - before[k] for k in keys}
    names = set(before["counters"]) | set(after["counters"])
    out["counters"] = {n: after["counters"].get(n, 0) - before["counters"].get(n, 0) for n in sorted(names)}
    out["links"], out["known"] = after["links"], after["known"]
    return out


async def receive(node: BenchNode, tally: NodeTally, tallies: Tallies, limits) -> None:
    from sapo.protocol.wire.codec import Rejected, decode

    async for message in node.incoming:
        started = time.thread_time()
        try:
            decode(message.data, limits)
        except Rejected:
            tallies.rejected += 1
            continue
        finally:
            tallies.decode_cpu_s += time.thread_time() - started
        tallies.delivered += 1
        digest = hashlib.sha256(message.data).digest()
        if digest in tally.seen:
            tally.duplicates += 1  # fetch asks `after` the newest it holds: this should stay 0
            continue
        tally.seen.add(digest)
        if message.sender != node.peer_id:
            tally.new_in_round += 1
            if tally.measuring:
                tally.authors[message.sender] += 1


async def node_rounds(node: BenchNode, tally: NodeTally, tallies: Tallies, plan: Plan, start: float) -> None:
    """The exchange's half of a round (GossipExchange.publish): share, then ask for `want`."""
    net = node.service
    started = start + plan.round_s * node.index / plan.nodes  # each node at its own phase
    for r in range(plan.warmup_rounds + plan.rounds):
        await trio.sleep_until(started + r * plan.round_s)
        tally.per_round.append(tally.new_in_round)  # what arrived for this round to train on
        tally.new_in_round = 0
        tally.measuring = r >= plan.warmup_rounds
        for k in range(plan.groups_per_round):
            cpu = time.thread_time()
            frame = node.frame(node.groups[(r * plan.groups_per_round + k) % len(node.groups)], r)
            tallies.build_cpu_s += time.thread_time() - cpu
            tallies.frame_bytes.append(len(frame))
            # `share` from 0.4.0 on; `publish` is what the node did before it (issue #31)
            shared = await net.share(frame, r) if hasattr(net, "share") else await net.publish(frame)
            tallies.shared += shared
            tallies.share_failed += not shared
        if hasattr(net, "want"):
            net.want(plan.want)
    await trio.sleep_until(started + (plan.warmup_rounds + plan.rounds) * plan.round_s)
    tally.per_round.append(tally.new_in_round)


def node_settings(plan: Plan, peers: list[str]):
    from sapo.protocol.settings import NetworkSettings

    extra = {"exchange": plan.mode} if "exchange" in NetworkSettings.model_fields else {}
    if not extra and plan.mode != "gossip":
        raise SystemExit(f"this tree's NetworkSettings has no `exchange`: mode {plan.mode!r} needs issue #31's change")
    return NetworkSettings(
        listen="/ip4/127.0.0.1/tcp/0", peers=peers, swarm="bench", discover_peers=plan.discover_peers, **extra
    )


async def start_nodes(nursery, plan: Plan, made: list, tallies: Tallies, tally_of: list, limits) -> list[BenchNode]:
    """Seeds first (seed k dials the seeds before it), then every other node, whose bootstrap
    list is every seed, as a public swarm's would be. (Each node dialling one seed of three left
    three clusters that discovery never joined: it hands out records of connected peers only,
    and stops dialling at its target. Gossip then delivered 40 % of groups at 64 nodes; see
    docs/bench/scale.md.)"""
    from sapo.protocol.network import serve_network
    from sapo.protocol.peers.identity import peer_id_of
    from sapo.training.problems.tasks import reasoning_gym_version

    nodes: list[BenchNode] = []
    for i, (key_pair, send, recv, groups) in enumerate(made):
        peers = [nodes[k].service.listen_addrs[0] for k in range(min(i, plan.seeds))]
        with trio.fail_after(30):
            net = await nursery.start(partial(serve_network, node_settings(plan, peers), key_pair, send))
        node = BenchNode(i, peer_id_of(key_pair), net, groups, recv, reasoning_gym_version())
        nodes.append(node)
        nursery.start_soon(receive, node, tally_of[i], tallies, limits)
    return nodes


async def run_scale(plan: Plan) -> dict:
    """One swarm: connect, settle, an idle phase, then warm-up and measured rounds."""
    from sapo.protocol.peers.identity import load_or_create_identity
    from sapo.protocol.wire.codec import DecodeLimits

    wrap_tcp_reads()
    warnings = LogTally()
    logging.getLogger().addHandler(warnings)
    tallies = Tallies()
    tally_of = [NodeTally() for _ in range(plan.nodes)]
    with tempfile.TemporaryDirectory(prefix="sapo-bench-scale-") as tmp:
        made = []
        for i in range(plan.nodes):
            send, recv = trio.open_memory_channel(1024)
            made.append((load_or_create_identity(Path(tmp) / f"node-{i}"), send, recv, build_groups(i, plan.seed)))
        async with trio.open_nursery() as nursery:
            began = time.monotonic()
            nodes = await start_nodes(nursery, plan, made, tallies, tally_of, DecodeLimits())
            nets = [node.service for node in nodes]
            with trio.fail_after(60):
                while not all(net.connected_peers() for net in nets):
                    await trio.sleep(0.1)
            connect_s = time.monotonic() - began
            say(f"{plan.mode} N={plan.nodes}: connected in {connect_s:.1f} s, settling {plan.settle_s:g} s")
            # N nodes' objects in one heap make each full collection N times a node's: 0.1-0.8 s
            # stalls of every node at once at 64 nodes, which one node never has. Start-up's
            # objects (keys, hosts, frames) stay out of the collections.
            gc.freeze()
            await trio.sleep(plan.settle_s)
            idle0 = snapshot(nets, tallies)
            await trio.sleep(plan.idle_s)
            idle1 = snapshot(nets, tallies)
            start = trio.current_time() + 0.5  # trio's clock: sleep_until reads it, not time.monotonic
            say(
                f"{plan.mode} N={plan.nodes}: idle measured; {plan.warmup_rounds}+{plan.rounds} rounds of {plan.round_s:g} s"
            )
            async with trio.open_nursery() as rounds:
                for node in nodes:
                    rounds.start_soon(node_rounds, node, tally_of[node.index], tallies, plan, start)
                await trio.sleep_until(start + plan.warmup_rounds * plan.round_s)
                active0 = snapshot(nets, tallies)
                await trio.sleep_until(start + (plan.warmup_rounds + plan.rounds) * plan.round_s)
                active1 = snapshot(nets, tallies)
            nursery.cancel_scope.cancel()
    logging.getLogger().removeHandler(warnings)
    return {
        "connect_s": round(connect_s, 2),
        "idle": delta(idle0, idle1),
        "active": delta(active0, active1),
        # per node: new external groups before each measured round began, and distinct authors
        "new_per_round": [t.per_round[plan.warmup_rounds + 1 :] for t in tally_of],
        "authors": [len(t.authors) for t in tally_of],
        "duplicates": sum(t.duplicates for t in tally_of),
        "rejected": tallies.rejected,
        "shared": tallies.shared,
        "share_failed": tallies.share_failed,
        "frame_bytes_mean": round(sum(tallies.frame_bytes) / max(1, len(tallies.frame_bytes))),
        "warnings": dict(warnings.counts.most_common(8)),
    }


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)
