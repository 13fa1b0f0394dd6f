"""A NATed node keeps receiving through a relay that cuts every circuit after a small byte budget.

Circuit Relay v2 relays announce limits: a circuit is reset once it has carried so many bytes
(128 KiB is a common implementation's default) or lived so long. Our own relay's limits are
large (256 MiB, an hour), but a circuit always ends some time. Here the relay's budget is 128 KiB,
so a circuit carrying four small groups a second lasts about half a minute.

The publisher is a standard libp2p peer that nobody here wrote (standard_peer.py: py-libp2p's
own host, GossipSub and relay client): it holds a slot on the relay, dials the NATed node's
relayed address once, and never dials again. So after a cut only the node can bring the link
back, through the relay, as it must for any peer it reached only through one (between two sapo
nodes, discovery also redials while a node is short of peers, at its own pace of up to ~12 s).

The topology is bench/nat_topology.py's: the relay (our node's network half, bench/gossip_peer.py,
relaying, gossiping another topic so it never carries a group itself) in a public namespace, the
node (gossip_peer.py: the node's real network, open_network) and the publisher each behind its own home
router (masquerade, unsolicited packets dropped); hole punching off (a punched hole would replace
the circuit and test nothing about it).

The publisher publishes four groups a second for two minutes. Every gap in the node's arrivals
must be under 10 s (delivery resumes within 10 s of each cut; groups otherwise arrive every 0.25 s),
at least 95 % of the groups must arrive, and the relay must have cut circuits at its limit at
least twice (or the test tested nothing).
"""

from __future__ import annotations

import time

import pytest

from bench.gossip_peer import PeerProcess, write_groups
from bench.nat_topology import NatTopology, missing
from tests.support.standard_peer import STANDARD_PEER

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"NAT namespaces: {missing()}")

CIRCUIT_BYTES = 128 * 1024  # a standard relay's default circuit data limit
RATE = 4.0  # groups per second
# Small groups (2 completions, ~800-byte frames), so that a circuit carries a few hundred of them,
# as in the report (127 groups in 5 s). py-libp2p's GossipSub, like the publisher here,
# queues up to 100 messages for 30 s for a peer it lost and sends them all when it is back: with
# 3 KB groups that burst alone was over 128 KiB, and every new circuit was cut at once.
GROUP_SIZE = {"completions": 2, "chars": 300}
PUBLISH_SECONDS = 120.0
DRAIN_SECONDS = 10.0
RESUME_SECONDS = 10.0
GAP_SECONDS = 1.0  # arrivals further apart than this (four a second) are a cut being recovered
RELAY_SWARM = "relay-only"


def relayed_link(node: PeerProcess, peer_id: str) -> bool:
    return (node.last_state() or {}).get("conns", {}).get(peer_id) == "relayed"


def wait_until(what: str, condition, timeout: float, peers: list[PeerProcess]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for peer in peers:
            assert peer.alive(), f"{peer.name} exited: {peer.log_tail()}"
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.5)


def gaps(arrivals: list[float], start: float, end: float) -> list[tuple[float, float]]:
    """(when, seconds) of every pause over GAP_SECONDS in the arrivals between start and end."""
    times = [start, *sorted(t for t in arrivals if start <= t <= end), end]
    return [(a, b - a) for a, b in zip(times, times[1:]) if b - a > GAP_SECONDS]


def test_a_natted_node_keeps_receiving_through_a_relay_that_cuts_circuits_at_a_byte_budget(tmp_path):
    tag = f"rl{time.time_ns() % 100000}"
    with NatTopology(tag, public=1, nated=2) as topo:
        groups = write_groups(tmp_path / "groups.json", **GROUP_SIZE)
        relay = PeerProcess(
            "relay",
            tmp_path / "relay",
            prefix=topo.prefix(topo.public_ns[0]),
            rate=0,
            groups_file=groups,
            state_seconds=1.0,
            settings={
                "swarm": RELAY_SWARM,
                "relay": "on",
                "reachability": "public",
                "relay_max_circuit_bytes": CIRCUIT_BYTES,
            },
        )
        everyone = [relay]
        try:
            relay_address = f"/ip4/{topo.public_ip[0]}/tcp/4001/p2p/{relay.wait_up(90)}"
            node = PeerProcess(
                "node",
                tmp_path / "node",
                prefix=topo.prefix(topo.nated_ns[0]),
                peers=[relay_address],
                rate=0,
                groups_file=groups,
                settings={"hole_punching": False},
            )
            everyone.append(node)
            node.wait_up(90)
            wait_until("the node's relay slot", lambda: (node.last_state() or {}).get("relayed"), 90, everyone)
            (circuit,) = node.last_state()["relayed"]
            publisher = PeerProcess(
                "publisher",
                tmp_path / "publisher",
                prefix=topo.prefix(topo.nated_ns[1]),
                peers=[circuit],
                rate=RATE,
                groups_file=groups,
                wait_go=True,
                settings={"reserve": relay_address},
                module=STANDARD_PEER,
            )
            everyone.append(publisher)
            publisher.wait_up(120)
            wait_until(
                "the node's relayed link to the publisher", lambda: relayed_link(node, publisher.peer_id), 60, everyone
            )
            time.sleep(2.0)  # heartbeats: the mesh takes the link in
            start = time.time() + 1.0
            publisher.go(start, PUBLISH_SECONDS)
            time.sleep(1.0 + PUBLISH_SECONDS + DRAIN_SECONDS)
        finally:
            for peer in everyone:
                peer.stop()

    published = {e["id"]: e["at"] for e in publisher.of("pub")}
    arrived = {e["id"]: e["at"] for e in node.of("recv") if e["id"] in published}
    pauses = gaps(list(arrived.values()), start, start + PUBLISH_SECONDS)
    cut = (relay.last_state() or {}).get("counters", {}).get("relay_circuits_limited", 0)
    counters = (node.last_state() or {}).get("counters", {})
    delivery = len(arrived) / max(1, len(published))
    print(
        f"\nrelay limits: {len(arrived)}/{len(published)} groups arrived ({delivery:.3f}); the relay cut {cut} "
        f"circuits; pauses over {GAP_SECONDS:g} s (s after start, length): "
        f"{[(round(at - start, 1), round(seconds, 1)) for at, seconds in pauses]}; node {counters}"
    )
    assert len(published) >= 0.9 * RATE * PUBLISH_SECONDS, f"only {len(published)} groups were published"
    assert all(seconds < RESUME_SECONDS for _, seconds in pauses), f"delivery paused too long: {pauses}"
    assert delivery >= 0.95, f"only {delivery:.3f} of the groups arrived"
    assert cut >= 2, f"the relay cut {cut} circuits: the test needs a few cuts to mean anything"
