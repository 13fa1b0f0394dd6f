"""ATTACK (h-attack3, on main 8ad662f): strangers' fresh keys push a node's own keys out of its
peerstore, and the next identify request ends the node.

py-libp2p 0.8.1's `PeerStore` holds at most `max_peers` = 1000 peers (libp2p/peer/peerstore.py:151);
past that, `add_addrs` calls `_enforce_peer_limit` (peerstore.py:201-221), which evicts peers with
no addresses first. The node's own entry holds its key pair and no address, so it is the first
to go. `BasicHost.get_public_key` and `get_private_key` read the peerstore (basic_host.py:403-407),
and from then on raise `PeerStoreError`: libp2p's identify handler (identify.py:88, reached through
protocol/toolkit/agents.py:48) raises inside the swarm's stream task, which is not caught, and
`host.run()` ends, and with it `serve_network`: the node is gone. `Network.publish` fails too
(pubsub.py:1596), and a relay cannot sign a reservation voucher.

Every connection that identifies adds its peer to the peerstore, as does every dial
(hosts.replace_addrs), and nothing removes them. So a stranger needs about 1,000 fresh keys that
each connect once (here 200 keys took 8.4 s from one process), and a node in a swarm of more than
1,000 peers gets there with no attacker at all. Here the node's own dials over its life are
stood in for by 950 peers it dialled (`replace_addrs`, as the dialer records them); then 80
fresh keys connect once each, and a newcomer connects.

Fixed: the host answers its own keys from its key pair (protocol/toolkit/hosts.py, `_OwnKeysHost`).
"""

from __future__ import annotations

import sys

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from sapo.protocol.toolkit.hosts import replace_addrs, speaks
from sapo.protocol.wire.group_wire import PROTOCOL_ID
from tests.support.gossip import start_node

MET_BEFORE = 950
FRESH_KEYS = 80


async def test_a_node_that_met_a_thousand_peers_keeps_its_keys_and_runs_on():
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            victim = await start_node(nursery, exchange="fetch")
            host = victim.service.host
            for index in range(MET_BEFORE):
                peer = ID.from_pubkey(create_new_key_pair().public_key)
                replace_addrs(
                    host, peer, [multiaddr.Multiaddr(f"/ip4/1.2.{index // 250}.{index % 250}/tcp/4001")], 3600
                )
            attack = await trio.run_process(
                [sys.executable, "-m", "tests.hardening.attack_fresh_keys", victim.addr, str(FRESH_KEYS), "20"],
                capture_stdout=True,
            )
            print(attack.stdout.decode().strip(), "peerstore:", len(host.get_peerstore().peer_data_map))
            newcomer = await start_node(nursery, exchange="fetch", peers=[victim.addr])
            victim_id = ID.from_base58(victim.service.peer_id)
            with trio.fail_after(10):
                while not speaks(newcomer.service.host, victim_id, PROTOCOL_ID):  # identify answered
                    await trio.sleep(0.1)
            assert await victim.service.publish(b"still here")
            nursery.cancel_scope.cancel()
