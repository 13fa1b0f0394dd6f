"""Helper process for test_attack_legacy_fanout.py: `k` "older releases" (gossip-mode networks
without `/sapo/groups/1`) that connect to a victim, publish one group each, print "ready", and
then just sit there (the test stops this process with SIGSTOP: readers that never read).

    python -m tests.hardening.attack_stalled_readers <victim multiaddr> <k>
"""

from __future__ import annotations

import sys

import trio
from libp2p.peer.id import ID

from sapo.protocol.wire.group_wire import PROTOCOL_ID
from tests.support.gossip import TOPIC, start_node


async def main(victim: str, k: int) -> None:
    victim_id = ID.from_base58(victim.rsplit("/p2p/", 1)[1])
    async with trio.open_nursery() as nursery:
        olds = []
        for _ in range(k):
            node = await start_node(nursery, exchange="gossip", discover_peers=0, peers=[victim])
            node.service.host.remove_stream_handler(PROTOCOL_ID)
            olds.append(node)
        for old in olds:
            with trio.fail_after(60):
                while victim_id not in old.service.pubsub.peers:
                    await trio.sleep(0.1)
            # a hostile client sends where it likes
            old.service.pubsub.router.mesh.setdefault(TOPIC, set()).add(victim_id)
        await trio.sleep(3)  # the victim identifies each one
        for old in olds:
            await old.service.publish(f"valid group of {old.service.peer_id}".encode())
            await trio.sleep(0.2)
        print("ready", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
