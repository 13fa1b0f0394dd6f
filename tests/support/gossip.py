"""Real networks (protocol/network.py) on 127.0.0.1, in the test's own trio run: start one, wait
for the GossipSub mesh, read what arrives."""

import os
import tempfile
from functools import partial
from pathlib import Path

import trio
from libp2p.crypto.ed25519 import create_new_key_pair

from sapo.protocol.network import serve_network
from sapo.protocol.settings import NetworkSettings, rollout_topic

SWARM = "test"
TOPIC = rollout_topic(SWARM)
LOOPBACK = "/ip4/127.0.0.1/tcp/0"


class Node:
    def __init__(self, service, inbox, counters):
        self.service, self.inbox, self.counters = service, inbox, counters

    @property
    def addr(self) -> str:
        return self.service.listen_addrs[0]


def swarm_key_file(psk: str) -> Path:
    """A libp2p swarm.key file holding `psk` (64 hex chars), as a private swarm's nodes are given."""
    handle, name = tempfile.mkstemp(suffix=".key")
    os.write(handle, f"/key/swarm/psk/1.0.0/\n/base16/\n{psk}\n".encode())
    os.close(handle)
    return Path(name)


async def start_node(
    nursery, *, peers=(), key_pair=None, listen=LOOPBACK, psk=None, exchange="gossip", **overrides
) -> Node:
    """A network on 127.0.0.1 in gossip mode: these are tests of the gossip layer, where a peer's
    publish reaches the others. In fetch mode (`exchange="fetch"`, the node's default) a group on
    the topic from anyone but an older release is refused before any check (test_group_fetch.py)."""
    overrides["exchange"] = exchange
    if psk is not None:
        overrides["swarm_key"] = swarm_key_file(psk)
    settings = NetworkSettings(**{"listen": listen, "peers": list(peers), "swarm": SWARM, **overrides})
    send, receive = trio.open_memory_channel(64)
    counters: dict[str, int] = {}
    network = await nursery.start(
        partial(serve_network, settings, key_pair or create_new_key_pair(), send, counters=counters)
    )
    return Node(network, receive, counters)


async def wait_for_mesh(nodes, timeout=10.0):
    """Until every node has every other node in its GossipSub mesh for TOPIC."""
    with trio.fail_after(timeout):
        for node in nodes:
            others = {other.service.peer_id for other in nodes if other is not node}
            while True:
                router = node.service.pubsub.router
                mesh = {peer.to_base58() for peer in router.mesh.get(TOPIC, ())}
                if others <= mesh:
                    break
                await trio.sleep(0.02)


async def receive_all(node, count, timeout=10.0):
    with trio.fail_after(timeout):
        return [await node.inbox.receive() for _ in range(count)]


def assert_empty(node):
    try:
        message = node.inbox.receive_nowait()
    except trio.WouldBlock:
        return
    raise AssertionError(f"unexpected {message.route} arrival from {message.sender}: {message.data[:20]!r}")
