"""The gossip benchmark's measurement (bench/gossip.py): N nodes in one trio process, publishing and timing.

Each node is a real network (protocol/network.py) on 127.0.0.1 with its own Ed25519 identity; every node
publishes its groups each round at its own phase, and every receiver decodes each frame with the
real codec, as a node's intake does before its checks. Latency is from just before `publish()`
to the receiver's `received_at`.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

from bench.gossip_groups import build_groups

SWARM = "bench"


@dataclass
class Totals:
    sent_at: dict[bytes, float] = field(default_factory=dict)  # frame -> time.time() before publish
    published: int = 0
    publish_failed: int = 0
    delivered: int = 0
    decode_rejected: int = 0
    latencies: list[float] = field(default_factory=list)
    frame_bytes: list[int] = field(default_factory=list)
    text_bytes: list[int] = field(default_factory=list)
    last_delivery: float = 0.0


@dataclass
class BenchNode:
    index: int
    peer_id: str
    service: object
    groups: list
    incoming: object
    rg_version: str

    def frame(self, group, round_index: int) -> bytes:
        # What node.exchange.GroupEncoder.frame does. Importing it would pull in node.core and
        # with it torch and transformers (about 9 s here) for two lines.
        from sapo.protocol.wire.codec import encode
        from sapo.protocol.wire.messages import to_wire

        message = to_wire(
            group,
            sender=self.peer_id,
            swarm=SWARM,
            sender_round=round_index,
            model_id="bench",
            created_at=time.time(),
            reasoning_gym_version=self.rg_version,
        )
        return encode(message)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def receive(node: BenchNode, totals: Totals, limits) -> None:
    from sapo.protocol.wire.codec import Rejected, decode

    async for message in node.incoming:
        sent = totals.sent_at.get(message.data)
        try:
            decode(message.data, limits)
        except Rejected:
            totals.decode_rejected += 1
            continue
        totals.delivered += 1
        totals.last_delivery = time.monotonic()
        if sent is not None:
            totals.latencies.append(message.received_at - sent)


async def publish_rounds(node: BenchNode, args: argparse.Namespace, totals: Totals, stop_at: float) -> None:
    # Nodes are not in lock step: each starts at its own phase within the round.
    await trio.sleep(args.round_seconds * node.index / args.nodes)
    round_index = 0
    while time.monotonic() < stop_at:
        round_started = time.monotonic()
        for k in range(args.groups_per_round):
            group = node.groups[(round_index * args.groups_per_round + k) % len(node.groups)]
            frame = node.frame(group, round_index)
            totals.frame_bytes.append(len(frame))
            totals.text_bytes.append(sum(len(c.encode()) for c in group.completions))
            totals.sent_at[frame] = time.time()
            if await node.service.publish(frame):
                totals.published += 1
            else:
                totals.publish_failed += 1
                del totals.sent_at[frame]
        round_index += 1
        next_round = min(round_started + args.round_seconds, stop_at)
        await trio.sleep(max(0.0, next_round - time.monotonic()))


def gossip_settings(args: argparse.Namespace, peers: list[str], discover: bool):
    from sapo.protocol.settings import NetworkSettings

    return NetworkSettings(
        listen="/ip4/127.0.0.1/tcp/0",
        peers=peers,
        swarm=SWARM,
        discover_peers=args.discover_peers if discover else 0,
        exchange="gossip",  # the topic is what this bench measures
    )


async def start_nodes(nursery, args: argparse.Namespace, discover: bool, made: list, totals, limits) -> list[BenchNode]:
    """Each node's network, in `nursery`, dialling node 0 (a star) or the node before it (a chain),
    and its receiving task: the nodes, each built once its network is up."""
    from sapo.protocol.network import serve_network
    from sapo.protocol.peers.identity import peer_id_of
    from sapo.training.problems.tasks import reasoning_gym_version

    nodes: list[BenchNode] = []
    for i, (key_pair, send, recv, groups) in enumerate(made):
        if i == 0:
            peers = []
        else:
            target = nodes[0] if args.topology == "star" else nodes[i - 1]
            peers = [target.service.listen_addrs[0]]
        with trio.fail_after(15):
            network = await nursery.start(
                partial(serve_network, gossip_settings(args, peers, discover), key_pair, send)
            )
        node = BenchNode(
            index=i,
            peer_id=peer_id_of(key_pair),
            service=network,
            groups=groups,
            incoming=recv,
            rg_version=reasoning_gym_version(),
        )
        nodes.append(node)
        nursery.start_soon(receive, node, totals, limits)
    return nodes


async def run_swarm(args: argparse.Namespace, discover: bool) -> dict:
    from sapo.protocol.peers.identity import load_or_create_identity
    from sapo.protocol.wire.codec import DecodeLimits

    limits = DecodeLimits()
    totals = Totals()
    phases: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sapo-bench-gossip-") as tmp:
        started = time.monotonic()
        made = []  # each node's identity, channel and groups; its network comes up below
        for i in range(args.nodes):
            key_pair = load_or_create_identity(Path(tmp) / f"node-{i}")
            send, recv = trio.open_memory_channel(1024)
            made.append((key_pair, send, recv, build_groups(i, args.seed)))
        phases["build groups s"] = time.monotonic() - started

        async with trio.open_nursery() as nursery:
            started = time.monotonic()
            nodes = await start_nodes(nursery, args, discover, made, totals, limits)
            with trio.fail_after(30):
                while not all(node.service.connected_peers() for node in nodes):
                    await trio.sleep(0.05)
            phases["connect s"] = time.monotonic() - started
            print(
                f"{args.nodes} nodes connected in {phases['connect s']:.1f} s; publishing for {args.seconds:g} s",
                file=sys.stderr,
                flush=True,
            )
            await trio.sleep(args.settle_seconds)  # a few heartbeats: the mesh forms

            cpu0, wall0 = time.process_time(), time.monotonic()
            stop_at = wall0 + args.seconds
            async with trio.open_nursery() as publishers:
                for node in nodes:
                    publishers.start_soon(publish_rounds, node, args, totals, stop_at)
            expected = totals.published * (args.nodes - 1)
            drain_deadline = time.monotonic() + args.drain_seconds
            while totals.delivered < expected and time.monotonic() < drain_deadline:
                await trio.sleep(0.05)
            cpu = time.process_time() - cpu0
            wall = time.monotonic() - wall0
            counters = {}
            for node in nodes:
                for name, value in node.service.counters.items():
                    counters[name] = counters.get(name, 0) + value
            links = [len(node.service.connected_peers()) for node in nodes]
            shutdown_started = time.monotonic()
            nursery.cancel_scope.cancel()
        phases["shutdown s"] = time.monotonic() - shutdown_started
    return {
        "totals": totals,
        "expected": expected,
        "cpu_s": cpu,
        "wall_s": wall,
        "counters": counters,
        "phases": phases,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "links": links,
        "discover": discover,
    }
