"""What relaying costs in CPU: `.venv/bin/python -m tests.protocol.relay_cost [MB]`.

Moves MB megabytes over one stream between two nodes on 127.0.0.1, first over a direct
connection, then through a third node's Circuit Relay v2 (the private peers of
test_relay.py), all in this one process, and reports CPU seconds per MB for each. The
difference is an upper bound on what the relay spends per relayed MB: it also holds the ends'
extra work on a relayed link (a second Noise layer and yamux each way). protocol/reach/relay_guards.py
derives the relay's default byte rate from it (RelayBudget)."""

from __future__ import annotations

import sys
import time

import multiaddr
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from tests.support.gossip import start_node

SINK = TProtocol("/sapo-bench/sink/1")
CHUNK = 60 * 1024


async def move(sender, receiver, megabytes: int) -> float:
    """CPU seconds (this process) to send `megabytes` MB from sender to receiver on one stream."""
    done = trio.Event()
    got = [0]
    total = megabytes * 1024 * 1024

    async def sink(stream) -> None:
        while got[0] < total:
            data = await stream.read(65536)
            if not data:
                break
            got[0] += len(data)
        done.set()

    receiver.service.host.set_stream_handler(SINK, sink)
    stream = await sender.service.host.new_stream(ID.from_base58(receiver.service.peer_id), [SINK])
    chunk = b"x" * CHUNK
    start = time.process_time()
    sent = 0
    while sent < total:
        await stream.write(chunk[: min(CHUNK, total - sent)])
        sent += min(CHUNK, total - sent)
    await done.wait()
    return time.process_time() - start


async def main(megabytes: int) -> None:
    private = {"reachability": "private", "hole_punching": False, "discover_peers": 0}
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            x = await start_node(nursery, discover_peers=0, reachability="public", relay="off")
            y = await start_node(nursery, peers=[x.addr], discover_peers=0, reachability="public", relay="off")
            while x.service.peer_id not in y.service.connected_peers():
                await trio.sleep(0.1)
            direct = await move(y, x, megabytes)

            relay = await start_node(
                nursery,
                relay="on",
                reachability="public",
                discover_peers=0,
                relay_max_circuit_bytes=4 * megabytes * 1024 * 1024,
            )
            a = await start_node(nursery, peers=[relay.addr], **private)
            b = await start_node(nursery, peers=[relay.addr], **private)
            while not (a.service.status().relayed_addrs and b.service.status().relayed_addrs):
                await trio.sleep(0.1)
            (circuit,) = b.service.status().relayed_addrs
            assert await a.service.dialer.dial(
                PeerInfo(ID.from_base58(b.service.peer_id), [multiaddr.Multiaddr(circuit)])
            )
            relayed = await move(a, b, megabytes)
            nursery.cancel_scope.cancel()
    per_mb = (relayed - direct) / megabytes
    print(
        f"direct: {direct / megabytes * 1000:.1f} ms CPU per MB; relayed: {relayed / megabytes * 1000:.1f} ms "
        f"CPU per MB; relaying adds at most {per_mb * 1000:.1f} ms CPU per MB "
        f"(so 5% of a core relays at most {0.05 / per_mb:.2f} MB/s)"
    )


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 16)
