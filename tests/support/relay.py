"""Relayed links between networks on loopback (tests/support/gossip.py's): who counts as private,
which kind of connection two nodes hold, a dial through the relay."""

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from sapo.protocol.toolkit.hosts import is_relayed

PRIVATE = {"reachability": "private", "hole_punching": False, "discover_peers": 0}


def kinds(node, other) -> set[bool]:
    """{True} relayed only, {False} direct only, both, or empty: node's open connections to `other`."""
    network = node.service.host.get_network()
    return {is_relayed(c) for c in network.get_connections(ID.from_base58(other.service.peer_id)) if not c.is_closed}


async def wait_until(condition, timeout: float) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.1)


async def dial_through_relay(a, b) -> None:
    (circuit,) = b.service.status().relayed_addrs
    info = PeerInfo(ID.from_base58(b.service.peer_id), [multiaddr.Multiaddr(circuit)])
    assert await a.service.dialer.dial(info)  # directly, else through the relay: connected
