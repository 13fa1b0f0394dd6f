"""Peer discovery compared: /sapo/peers/1 against py-libp2p 0.8.1's rendezvous and Kademlia.

`--nodes` real networks (protocol/network.py) on 127.0.0.1 in one trio process start as a star around node 0
(every other node's only `peers` entry), which is where discovery must take over: GossipSub
prunes the hub's mesh to D_high and a pure star delivers badly past 12 leaves (bench/README.md).
Each mechanism then has to get every node to `--target` connections (the node's
`discover_peers`), dialling through the network's own dial (so bans and the allow list
apply to what the mechanism asks it to dial, not to what the library dials by itself):

  sapo        /sapo/peers/1 (protocol/exchange/discovery.py): signed records of peers that are connected now;
  rendezvous  libp2p's RendezvousService on the hub; every node REGISTERs, then DISCOVERs and dials;
  kademlia    libp2p's KadDHT (server mode) on every node, seeded with the hub; a self-lookup
              fills the routing table, whose peers are dialled.

Measured for each: seconds until every node has its target, connections per node after (a
mechanism that opens more than it was asked for costs every message a copy), delivery and
latency of `--seconds` of rollout groups, and then churn: `--replace` nodes leave and as many
new ones join, and we count the new nodes' failed dials (stale entries) and their time to target.

    .venv/bin/python -m bench.discovery                     # 16 nodes, target 4, all three
    .venv/bin/python -m bench.discovery --nodes 8 --mechanisms sapo,kademlia
    .venv/bin/python -m bench.discovery --smoke
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from bench.gossip_groups import build_groups
from bench.gossip_swarm import SWARM, BenchNode, Totals, percentile, publish_rounds, receive

MECHANISMS = ("sapo", "rendezvous", "kademlia")
NAMESPACE = "sapo/bench"
ASK_SECONDS = 1.0  # how often a node short of its target asks again (as /sapo/peers/1 does)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--target", type=int, default=4, help="connections each node should reach (discover_peers)")
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS))
    parser.add_argument("--seconds", type=float, default=20.0, help="publishing, once formed")
    parser.add_argument(
        "--rate",
        type=float,
        default=0.25,
        help="groups per second per node (all nodes share one process: keep it below saturation)",
    )
    parser.add_argument("--replace", type=int, default=4, help="nodes that leave and are replaced, afterwards")
    parser.add_argument("--timeout", type=float, default=90.0, help="give up forming after this long")
    parser.add_argument("--smoke", action="store_true", help="4 nodes, target 2, 2 s, replace 1")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.target, args.seconds, args.replace, args.timeout = 4, 2, 2.0, 1, 60.0
    args.mechanisms = [m for m in args.mechanisms.split(",") if m]
    if not set(args.mechanisms) <= set(MECHANISMS):
        parser.error(f"--mechanisms takes {', '.join(MECHANISMS)}")
    args.groups_per_round, args.round_seconds = 1, 1.0 / args.rate  # what publish_rounds reads
    return args


@dataclass
class Member:
    node: BenchNode
    scope: trio.CancelScope
    dial_failures: int = 0
    joined_at: float = 0.0
    formed_at: float | None = None
    extra: dict = field(default_factory=dict)


async def dial_candidates(member: Member, candidates, target: int) -> None:
    """Dial random unconnected candidates (PeerInfos) until `target` connections, through the
    gossip service's own bounded dial, which refuses banned and not-allowed peers."""
    service = member.node.service
    connected = set(service.connected_peers())
    pool = [
        c for c in candidates if c.peer_id.to_base58() not in connected and c.peer_id.to_base58() != service.peer_id
    ]
    random.shuffle(pool)
    for info in pool[: max(0, target - len(connected))]:
        if not await service.dialer.dial(info):
            member.dial_failures += 1


async def rendezvous_loop(member: Member, hub_id, target: int) -> None:
    from libp2p.discovery.rendezvous import RendezvousClient

    client = RendezvousClient(member.node.service.host, hub_id)
    registered = False
    while True:
        try:
            with trio.fail_after(10):
                if not registered:
                    await client.register(NAMESPACE, ttl=120)
                    registered = True
                if len(member.node.service.connected_peers()) < target:
                    peers, _ = await client.discover(NAMESPACE, limit=100)
                    await dial_candidates(member, peers, target)
        except Exception:  # noqa: BLE001 - the hub is busy or gone: ask again later
            pass
        await trio.sleep(ASK_SECONDS if len(member.node.service.connected_peers()) < target else 10.0)


async def kademlia_loop(member: Member, hub_id, target: int) -> None:
    from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
    from libp2p.peer.peerinfo import PeerInfo
    from libp2p.tools.anyio_service import background_trio_service

    host = member.node.service.host
    dht = KadDHT(host, DHTMode.SERVER)
    async with background_trio_service(dht):
        member.extra["dht"] = dht
        if hub_id is not None:
            await dht.add_peer(hub_id, skip_server_mode_check=True)
        while True:
            if len(member.node.service.connected_peers()) < target:
                try:
                    with trio.fail_after(10):
                        await dht.peer_routing.find_closest_peers_network(host.get_id().to_bytes(), 20)
                except Exception:  # noqa: BLE001
                    pass
                store = host.get_peerstore()
                infos = [PeerInfo(p, store.addrs(p)) for p in dht.routing_table.get_peer_ids()]
                await dial_candidates(member, [i for i in infos if i.addrs], target)
            await trio.sleep(ASK_SECONDS if len(member.node.service.connected_peers()) < target else 10.0)


async def start_member(
    nursery, index: int, mechanism: str, args, tmp: Path, hub: Member | None, totals: Totals, groups
) -> Member:
    from sapo.protocol.network import open_network
    from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of
    from sapo.protocol.settings import NetworkSettings
    from sapo.protocol.wire.codec import DecodeLimits
    from sapo.training.problems.tasks import reasoning_gym_version

    key_pair = load_or_create_identity(tmp / f"{mechanism}-{index}")
    send, incoming = trio.open_memory_channel(1024)
    peers = [hub.node.service.listen_addrs[0]] if hub is not None else []
    settings = NetworkSettings(
        listen="/ip4/127.0.0.1/tcp/0",
        peers=peers,
        swarm=SWARM,
        discover_peers=args.target if mechanism == "sapo" else 0,
    )
    scope = trio.CancelScope()
    joined_at = time.monotonic()

    async def lifetime(task_status=trio.TASK_STATUS_IGNORED):
        with scope:
            async with open_network(settings, key_pair, send) as service, trio.open_nursery() as inner:
                node = BenchNode(
                    index=index,
                    peer_id=peer_id_of(key_pair),
                    service=service,
                    groups=groups,
                    incoming=incoming,
                    rg_version=reasoning_gym_version(),
                )
                member = Member(node, scope, joined_at=joined_at)
                task_status.started(member)
                inner.start_soon(receive, node, totals, DecodeLimits())
                hub_id = hub.node.service.host.get_id() if hub is not None else None
                if mechanism == "rendezvous":
                    if hub is None:
                        from libp2p.discovery.rendezvous import RendezvousService

                        RendezvousService(service.host)
                    else:
                        while not service.connected_peers():
                            await trio.sleep(0.1)
                        inner.start_soon(rendezvous_loop, member, hub_id, args.target)
                elif mechanism == "kademlia":
                    while hub is not None and not service.connected_peers():
                        await trio.sleep(0.1)
                    inner.start_soon(kademlia_loop, member, hub_id, args.target)

    return await nursery.start(lifetime)


async def run_mechanism(mechanism: str, args, tmp: Path, groups_pool) -> dict:
    totals = Totals()
    want = min(args.target, args.nodes - 1)
    result: dict = {"mechanism": mechanism}
    async with trio.open_nursery() as nursery:
        started = time.monotonic()
        hub = await start_member(nursery, 0, mechanism, args, tmp, None, totals, groups_pool[0])
        members = [hub]
        for i in range(1, args.nodes):
            members.append(await start_member(nursery, i, mechanism, args, tmp, hub, totals, groups_pool[i % 4]))
        result["formed s"] = await wait_formed(members[1:], want, started, args.timeout)
        await trio.sleep(2.0)  # heartbeats: the mesh takes in the new links
        links = [len(m.node.service.connected_peers()) for m in members]
        result["links mean"], result["links max"] = sum(links) / len(links), max(links)
        stop_at = time.monotonic() + args.seconds
        async with trio.open_nursery() as publishers:
            for m in members:
                publishers.start_soon(publish_rounds, m.node, args, totals, stop_at)
        expected = totals.published * (args.nodes - 1)
        with trio.move_on_after(5.0):
            while totals.delivered < expected:
                await trio.sleep(0.05)
        result["delivery"] = totals.delivered / expected if expected else 0.0
        result["p50 ms"], result["p99 ms"] = (1e3 * percentile(totals.latencies, q) for q in (50, 99))
        # churn: some leave, as many join, bootstrapping from the hub as before
        leavers = random.Random(0).sample(members[1:], args.replace)
        for m in leavers:
            m.scope.cancel()
        await trio.sleep(1.0)
        joined_at = time.monotonic()
        joiners = [
            await start_member(nursery, args.nodes + k, mechanism, args, tmp, hub, totals, groups_pool[k % 4])
            for k in range(args.replace)
        ]
        result["rejoin s"] = await wait_formed(joiners, want, joined_at, args.timeout)
        result["rejoin failed dials"] = sum(m.dial_failures for m in joiners)
        result["hub table"] = hub_knows(hub, mechanism)
        nursery.cancel_scope.cancel()
    return result


def hub_knows(hub: Member, mechanism: str) -> int:
    if mechanism == "sapo":
        return len(hub.node.service.discovery.table)
    if mechanism == "kademlia":
        return hub.extra["dht"].routing_table.size() if "dht" in hub.extra else 0
    return -1  # the rendezvous registrations live in the service; not read here


async def wait_formed(members: list[Member], want: int, started: float, timeout: float) -> float:
    with trio.move_on_after(timeout):
        while not all(len(m.node.service.connected_peers()) >= want for m in members):
            await trio.sleep(0.1)
        return time.monotonic() - started
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    groups_pool = [build_groups(i, 0) for i in range(4)]
    results = []
    with tempfile.TemporaryDirectory(prefix="sapo-bench-discovery-") as tmp:
        for mechanism in args.mechanisms:
            results.append(trio.run(run_mechanism, mechanism, args, Path(tmp), groups_pool))
    print()
    print(
        f"discovery benchmark: {args.nodes} nodes in ONE trio process on 127.0.0.1, star around node 0, target "
        f"{args.target} connections, {args.rate:g} groups/s per node for {args.seconds:g} s, then {args.replace} replaced; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    columns = ["formed s", "links mean", "links max", "delivery", "p50 ms", "p99 ms", "rejoin s", "rejoin failed dials"]
    print(f"{'mechanism':<11}" + "".join(f"{c:>21}" for c in columns))
    for r in results:
        print(
            f"{r['mechanism']:<11}"
            + "".join(f"{r[c]:>21.3f}" if isinstance(r[c], float) else f"{r[c]:>21}" for c in columns)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
