"""Peers behind NAT reach each other through a relay, and hole-punch where their NAT allows.

One public namespace holds the bootstrap node; three gossip peers sit each behind its own home
router (bench/nat_topology.py: nftables masquerade, no port forwarding, unsolicited packets
dropped), and one of those routers is a symmetric NAT, which no hole punch gets through. The
bootstrap relays (relay "auto": it finds itself public) but gossips another topic, so it never
forwards the swarm's groups itself: a group can only get from one NATed peer to another over a
relayed circuit or a hole-punched connection. A subscribed hub would carry every message itself
in a swarm this small and hide whether the NATed peers can reach each other at all.

The swarm is bench/nat.py's (`run_swarm`), so the benchmark cannot rot. The peers are
bench/gossip_peer.py processes: the node's real network (open_network) publishing real RolloutGroup
frames, without the model (a training node takes minutes a round and would test nothing more
about the network). The last test is the control: the same swarm with the relay switched off
delivers nothing, so the NATs are real and the first test depends on the relay.

Addresses (198.51.100.0/24, 10.66.x.0/24) exist only inside the namespaces, deleted afterwards.
"""

from __future__ import annotations

import pytest

from bench import nat  # the same swarm its benchmark measures
from bench.nat_topology import missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"NAT namespaces: {missing()}")

NATED = 3
PUBLISH_SECONDS = 8.0
RATE = 1.0  # groups per second per peer
DRAIN_SECONDS = 6.0


def linked_and_punched(peers) -> bool:
    """Every pair linked, and the two cone-NAT peers' link hole-punched (direct, relay leg maybe still open)."""
    kinds = nat.link_kinds(nat.links(peers))
    return nat.all_linked(peers) and kinds["direct"] + kinds["both"] >= 1


def natted_swarm(**more) -> nat.SwarmRun:
    """Three NATed peers, the last behind a symmetric NAT (its links can only be relayed
    circuits), publishing once every pair is linked and the cone pair's link is punched."""
    return nat.run_swarm(
        nated=NATED,
        rate=RATE,
        seconds=PUBLISH_SECONDS,
        drain=DRAIN_SECONDS,
        symmetric=frozenset({NATED - 1}),
        ready=linked_and_punched,
        ready_timeout=120,
        **more,
    )


def test_groups_from_every_natted_peer_reach_every_other_through_relay_or_punched_hole():
    # the last router is a symmetric NAT: its peer's links can only be relayed circuits
    run = natted_swarm()
    print(
        f"\nNAT: ready in {run.phases['ready s']:.0f} s; links direct/relayed/both {run.after}; "
        f"{len(run.published)} groups published"
    )
    assert run.states["bootstrap"]["relaying"], "the public bootstrap should relay once it finds itself public"
    peers = [peer for peer, name in run.names.items() if name != "bootstrap"]
    for peer in peers:
        state = run.states[run.names[peer]]
        assert state["reachability"] == "private", (run.names[peer], state["reachability"])
        assert state["relayed"] and "/p2p-circuit/p2p/" in state["relayed"][0], state["relayed"]
    assert len(run.published) >= NATED * PUBLISH_SECONDS * RATE * 0.8, (
        f"only {len(run.published)} groups were published"
    )
    for peer in peers:
        missed = run.missing(peer)
        assert not missed, f"{run.names[peer]} missed {len(missed)} groups"
    bootstrap = next(peer for peer, name in run.names.items() if name == "bootstrap")
    assert not run.received[bootstrap], "the bootstrap gossips another topic: it must not have carried a group"
    assert run.after["relayed"] + run.after["both"] >= 2, run.after  # the symmetric NAT's two links
    assert run.after["direct"] + run.after["both"] >= 1, run.after  # and the cone pair's punched one


def test_fetched_groups_cross_relays_and_punched_holes():
    """0.4.0's way: nothing on the topic; each NATed peer asks the others for their groups over
    the same relayed circuits and punched links, and gets them from every other peer."""
    run = natted_swarm(fetch=4)
    peers = [peer for peer, name in run.names.items() if name != "bootstrap"]
    by_author = {p: {g for g, (author, _) in run.published.items() if author == p} for p in peers}
    print(f"\nNAT fetch: links direct/relayed/both {run.after}; {len(run.published)} groups offered")
    assert len(run.published) >= NATED * PUBLISH_SECONDS * RATE * 0.8
    for peer in peers:
        got = set(run.received.get(peer, {}))
        for author in peers:
            if author != peer:
                share = len(got & by_author[author]) / len(by_author[author])
                assert share >= 0.8, f"{run.names[peer]} fetched {share:.0%} of {run.names[author]}'s groups"
    bootstrap = next(peer for peer, name in run.names.items() if name == "bootstrap")
    assert not run.received[bootstrap], "the bootstrap asks for nothing and is of another swarm"
    assert run.after["relayed"] + run.after["both"] >= 2, run.after  # the symmetric NAT's links are circuits


def test_control_without_a_relay_natted_peers_never_meet():
    def tried_to_dial(peers) -> bool:  # each learns the others' records from the bootstrap: dropped SYNs
        return all((p.last_state() or {}).get("counters", {}).get("discovery_dial_failed", 0) >= 1 for p in peers)

    run = nat.run_swarm(
        nated=NATED,
        rate=RATE,
        seconds=PUBLISH_SECONDS,
        drain=DRAIN_SECONDS,
        relay="off",
        ready=tried_to_dial,
        ready_timeout=90,
    )
    assert run.after == {"direct": 0, "relayed": 0, "both": 0}, run.after
    assert len(run.published) >= NATED * PUBLISH_SECONDS * RATE * 0.8
    for peer, name in run.names.items():
        assert not run.received[peer], f"{name} received groups without a relay"
