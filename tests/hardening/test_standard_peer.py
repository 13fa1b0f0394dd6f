"""A standard libp2p peer that speaks gossipsub only (standard_peer.py: py-libp2p's own host and
GossipSub, nothing of sapo's) joins a real node. For a minute the node logs no ERROR, and no
WARNING about that peer; it finds out once (an INFO line each, and a counter) that the peer has
no /sapo/peers/1 discovery and no AutoNAT, never counts that as a failure, and the two exchange
groups both ways: the node trains on the peer's valid groups, the peer receives the node's."""

from __future__ import annotations

import json
import time

from bench.gossip_peer import PeerProcess
from tests.support.groups import honest_group
from tests.support.processes import PLUMBING, NodeProcess
from tests.support.standard_peer import STANDARD_PEER

SECONDS = 60.0
RATE = 0.5  # groups per second from the standard peer


def test_a_gossipsub_only_peer_is_no_error_and_still_exchanges_groups(tmp_path, nodes):
    node = NodeProcess(tmp_path / "n", [*PLUMBING])  # fetching: the topic takes an older peer's groups
    nodes.append(node)
    groups = tmp_path / "groups.json"  # distinct questions: the node refuses a repeat as a duplicate
    groups.write_text(json.dumps([honest_group(i).model_dump(mode="json") for i in range(int(SECONDS * RATE) + 10)]))
    peer = PeerProcess(
        "standard",
        tmp_path / "standard",
        listen="/ip4/127.0.0.1/tcp/0",
        peers=[node.address],
        rate=RATE,
        groups_file=groups,
        settings={"swarm": "default"},
        module=STANDARD_PEER,
    )
    try:
        peer.wait_up(90)
        end = time.monotonic() + SECONDS
        while time.monotonic() < end:
            assert node.alive(), node.log_text()[-3000:]
            assert peer.alive(), peer.log_tail()
            time.sleep(1.0)
        rows = node.metrics()
    finally:
        peer.stop()

    log = node.log_text().splitlines()
    errors = [line for line in log if " ERROR " in line]
    warnings = [line for line in log if " WARNING " in line]
    about_peer = [line for line in errors + warnings if peer.peer_id in line]
    told = [line for line in log if "does not speak" in line and peer.peer_id in line]
    transport = rows[-1]["transport"] if rows else {}
    accepted = rows[-1]["accepted_from"].get(peer.peer_id, 0) if rows else 0
    from_node = [e for e in peer.of("recv") if e["sender"] == node.peer_id]
    print(
        f"\nstandard peer: node accepted {accepted} of {len(peer.of('pub'))} groups it published; it received "
        f"{len(from_node)} of the node's; node log: {len(errors)} ERROR, {len(warnings)} WARNING lines; "
        f"transport {transport}"
    )
    assert not errors, errors[:5]
    assert not about_peer, about_peer[:5]
    assert len(told) == 3 and all(" INFO " in line for line in told), told  # discovery, AutoNAT, fetching: once each
    assert transport.get("peers_without_discovery") == 1 and transport.get("peers_without_autonat") == 1, transport
    assert not transport.get("discovery_failed"), transport
    assert accepted >= 5, f"the node accepted only {accepted} of the peer's groups"
    assert len(from_node) >= 3, f"the peer received only {len(from_node)} of the node's groups"
