"""Peers behind NAT reach each other through a relay, and hole-punch where their NAT allows.

One public namespace holds the bootstrap node; three gossip peers sit each behind its own home
router (bench/nat_topology.py: nftables masquerade, no port forwarding, unsolicited packets
dropped), and one of those routers is a symmetric NAT, which no hole punch gets through. The
bootstrap relays (relay "auto": it finds itself public) but gossips another topic, so it never
forwards the swarm's groups itself: a group can only get from one NATed peer to another over a
relayed circuit or a hole-punched connection. A subscribed hub would carry every message itself
in a swarm this small and hide whether the NATed peers can reach each other at all.

The peers are bench/gossip_peer.py processes: the node's real GossipService publishing real
RolloutGroup frames, without the model (a training node takes minutes a round and would test
nothing more about the network). The last test is the control: the same swarm with the relay
switched off delivers nothing, so the NATs are real and the first test depends on the relay.

Addresses (198.51.100.0/24, 10.66.x.0/24) exist only inside the namespaces, deleted afterwards.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from gossip_peer import PeerProcess, write_groups  # noqa: E402
from nat import RELAY_ONLY_TOPIC, link_kinds, links  # noqa: E402
from nat_topology import NatTopology, missing  # noqa: E402

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"NAT namespaces: {missing()}")

NATED = 3
PUBLISH_SECONDS = 8.0
RATE = 1.0  # groups per second per peer
DRAIN_SECONDS = 6.0


def start_swarm(tmp_path: Path, topo: NatTopology, relay: str) -> tuple[PeerProcess, list[PeerProcess]]:
    groups = write_groups(tmp_path / "groups.json")
    boot = PeerProcess("bootstrap", tmp_path / "bootstrap", prefix=topo.prefix(topo.public_ns[0]), rate=0,
                       settings={"topic": RELAY_ONLY_TOPIC, "relay": relay}, groups_file=groups)
    started = [boot]
    try:
        boot_id = boot.wait_up(90)
        address = f"/ip4/{topo.public_ip[0]}/tcp/4001/p2p/{boot_id}"
        for i in range(NATED):
            started.append(PeerProcess(f"nat{i}", tmp_path / f"nat{i}", prefix=topo.prefix(topo.nated_ns[i]),
                                       peers=[address], rate=RATE, index=i, groups_file=groups, wait_go=True))
        for peer in started[1:]:
            peer.wait_up(120)
    except BaseException:
        for peer in started:
            peer.stop()
        raise
    return boot, started[1:]


def wait_for(condition, timeout: float, what: str, processes: list[PeerProcess]) -> float:
    started = time.monotonic()
    while not condition():
        dead = [p.name for p in processes if not p.alive()]
        assert not dead, f"{dead} exited: {processes[0].log_tail()}"
        assert time.monotonic() - started < timeout, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.5)
    return time.monotonic() - started


def publish_and_collect(peers: list[PeerProcess]) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Every peer publishes for PUBLISH_SECONDS; (group id -> author, peer id -> group ids received)."""
    go = time.time() + 1.0
    for peer in peers:
        peer.go(go, PUBLISH_SECONDS)
    time.sleep(1.0 + PUBLISH_SECONDS + DRAIN_SECONDS)
    authors = {e["id"]: p.peer_id for p in peers for e in p.of("pub") if e["ok"]}
    received = {p.peer_id: {e["id"] for e in p.of("recv")} for p in peers}
    return authors, received


def test_groups_from_every_natted_peer_reach_every_other_through_relay_or_punched_hole(tmp_path):
    with NatTopology(f"nat{os.getpid() % 10000}", public=1, nated=NATED, symmetric=frozenset({NATED - 1})) as topo:
        boot, peers = start_swarm(tmp_path, topo, relay="auto")
        everyone = [boot, *peers]
        try:
            # discover_peers (4) is more than there are others: every pair links up.
            def all_linked() -> bool:
                return all(len(neighbours) == NATED - 1 for neighbours in links(peers).values())

            formed = wait_for(all_linked, 120, "every NATed pair to link up", everyone)
            time.sleep(3.0)  # a few GossipSub heartbeats: the mesh forms on the new links
            authors, received = publish_and_collect(peers)
            kinds = link_kinds(links(peers))
            states = {p.name: p.last_state() for p in everyone}
        finally:
            for p in everyone:
                p.stop()
    print(f"\nNAT: linked in {formed:.0f} s; links direct/relayed/both {kinds}; "
          f"{len(authors)} groups published")
    assert states["bootstrap"]["relaying"], "the public bootstrap should relay once it finds itself public"
    for p in peers:
        state = states[p.name]
        assert state["reachability"] == "private", (p.name, state["reachability"])
        assert state["relayed"] and "/p2p-circuit/p2p/" in state["relayed"][0], state["relayed"]
    assert len(authors) >= NATED * PUBLISH_SECONDS * RATE * 0.8, f"only {len(authors)} groups were published"
    for peer in peers:
        expected = {group for group, author in authors.items() if author != peer.peer_id}
        missing_groups = expected - received[peer.peer_id]
        assert not missing_groups, f"{peer.name} missed {len(missing_groups)} of {len(expected)} groups"
    assert not boot.of("recv"), "the bootstrap gossips another topic: it must not have carried a group"
    # the symmetric NAT's links cannot be punched: at least those two stay relayed circuits
    assert kinds["relayed"] + kinds["both"] >= 2, kinds


def test_control_without_a_relay_natted_peers_never_meet(tmp_path):
    with NatTopology(f"nac{os.getpid() % 10000}", public=1, nated=NATED) as topo:
        boot, peers = start_swarm(tmp_path, topo, relay="off")
        everyone = [boot, *peers]
        try:
            # each peer learns the others' records from the bootstrap and dials them: dropped SYNs
            wait_for(lambda: all((p.last_state() or {}).get("counters", {}).get("discovery_dial_failed", 0) >= 1
                                 for p in peers), 90, "every peer to try (and fail) a direct dial", everyone)
            authors, received = publish_and_collect(peers)
            kinds = link_kinds(links(peers))
        finally:
            for p in everyone:
                p.stop()
    assert kinds == {"direct": 0, "relayed": 0, "both": 0}, kinds
    assert len(authors) >= NATED * PUBLISH_SECONDS * RATE * 0.8
    for peer in peers:
        assert not received[peer.peer_id], f"{peer.name} received groups without a relay"
