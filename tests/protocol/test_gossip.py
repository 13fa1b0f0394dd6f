"""Real py-libp2p hosts on 127.0.0.1 (port 0): the gossip service and its guards."""

import socket
from contextlib import asynccontextmanager

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
from libp2p.pubsub.pb import rpc_pb2
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.utils import encode_varint_prefixed

from sapo.protocol.exchange.gossip import Delivery
from sapo.protocol.network import counter
from sapo.protocol.peers.identity import peer_id_of
from tests.support.gossip import (
    LOOPBACK,
    TOPIC,
    assert_empty,
    receive_all,
    start_node,
    wait_for_mesh,
)


@asynccontextmanager
async def raw_host(sec_opt=None):
    """A bare py-libp2p host (no pubsub) for sending what a well-behaved node never would."""
    key_pair = create_new_key_pair()
    sec_opt = sec_opt or {
        NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)
    }
    listen = multiaddr.Multiaddr(LOOPBACK)
    host = new_host(
        key_pair=key_pair,
        sec_opt=sec_opt,
        muxer_opt={YAMUX_PROTOCOL_ID: Yamux},
        listen_addrs=[listen],
    )
    async with host.run([listen]):
        try:
            yield host
        finally:
            with trio.move_on_after(2) as scope:
                scope.shield = True
                await host.close()


async def test_two_nodes_exchange_messages():
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery)
            b = await start_node(nursery, peers=[a.addr])
            await wait_for_mesh([a, b])
            assert await a.service.publish(b"from a")
            assert await b.service.publish(b"from b")
            [at_b] = await receive_all(b, 1)
            [at_a] = await receive_all(a, 1)
            assert (at_b.sender, at_b.data) == (a.service.peer_id, b"from a")
            assert (at_a.sender, at_a.data) == (b.service.peer_id, b"from b")
            await trio.sleep(0.2)
            assert_empty(a)  # never our own message
            assert_empty(b)
            assert a.counters["published"] == 1 and a.counters["received"] == 1
            nursery.cancel_scope.cancel()


async def test_three_nodes_each_receive_the_others():
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery)
            b = await start_node(nursery, peers=[a.addr])
            c = await start_node(nursery, peers=[a.addr, b.addr])
            nodes = [a, b, c]
            await wait_for_mesh(nodes)
            for node in nodes:
                assert await node.service.publish(f"hello from {node.service.peer_id}".encode())
            for node in nodes:
                messages = await receive_all(node, 2)
                others = {other.service.peer_id for other in nodes if other is not node}
                assert {m.sender for m in messages} == others
                assert all(m.data == f"hello from {m.sender}".encode() for m in messages)
            await trio.sleep(0.2)
            for node in nodes:
                assert_empty(node)
            nursery.cancel_scope.cancel()


async def test_100_kb_messages_intact_while_a_peer_joins():
    # Over yamux's 64 KB frame size. When C joins mid-burst, A's message-cache replay to C
    # and A's per-peer sender write to the same stream at once; without the per-stream write
    # lock their frames interleave and C reads corrupt RPCs (measured: C got 0-6 of 30).
    payloads = [bytes(range(256)) * 400 + i.to_bytes(2, "big") for i in range(30)]  # ~100 KB
    with trio.fail_after(25):
        async with trio.open_nursery() as nursery:
            # No discovery: this is about A's stream to C; a B-C link would double the 3 MB that
            # this one interpreter must move, and time out on a busy machine.
            a = await start_node(nursery, discover_peers=0)
            b = await start_node(nursery, peers=[a.addr], discover_peers=0)
            await wait_for_mesh([a, b])

            async def burst():
                for payload in payloads:
                    assert await a.service.publish(payload)
                    await trio.sleep(0.03)

            nursery.start_soon(burst)
            await trio.sleep(0.1)
            c = await start_node(nursery, peers=[a.addr], discover_peers=0)
            for node in (b, c):
                messages = await receive_all(node, len(payloads))
                assert sorted(m.data for m in messages) == payloads
                assert {m.sender for m in messages} == {a.service.peer_id}
            for node in (a, b, c):
                assert node.counters.get("malformed_frame", 0) == 0
            nursery.cancel_scope.cancel()


async def test_malformed_frame_drops_the_peer_not_the_node():
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery)
            b = await start_node(nursery, peers=[a.addr])
            await wait_for_mesh([a, b])
            async with raw_host() as attacker:
                target = info_from_p2p_addr(multiaddr.Multiaddr(a.addr))
                await attacker.connect(target)
                stream = await attacker.new_stream(target.peer_id, [PROTOCOL_ID_V11])
                # A length-prefixed frame that is not a protobuf RPC (field 0x1fffffff with
                # wire type 7): py-libp2p 0.8.1 raises DecodeError out of its read loop.
                await stream.write(encode_varint_prefixed(b"\xff" * 16))
                while a.counters.get("malformed_frame", 0) == 0:
                    await trio.sleep(0.02)
                with trio.fail_after(5):
                    while attacker.get_id().to_base58() in a.service.connected_peers():
                        await trio.sleep(0.02)
            # The node is still up and still gossiping.
            assert await b.service.publish(b"after the attack")
            [message] = await receive_all(a, 1)
            assert message.data == b"after the attack"
            assert await a.service.publish(b"a still publishes")
            [message] = await receive_all(b, 1)
            assert message.data == b"a still publishes"
            nursery.cancel_scope.cancel()


async def test_oversized_messages_are_refused_and_rejected():
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery)  # 256 KiB limit
            big = await start_node(nursery, peers=[a.addr], max_message_bytes=512 * 1024)
            await wait_for_mesh([a, big])

            assert not await a.service.publish(b"x" * (256 * 1024 + 1))
            assert a.counters["publish_dropped"] == 1

            assert await big.service.publish(b"y" * (300 * 1024))  # within big's own limit
            with trio.fail_after(5):
                while a.counters.get("oversized", 0) == 0:
                    await trio.sleep(0.02)
            # Rejected, not delivered, and the peer is still there to send a fine message.
            assert await big.service.publish(b"small")
            [message] = await receive_all(a, 1)
            assert message.data == b"small"
            assert a.counters.get("malformed_frame", 0) == 0
            nursery.cancel_scope.cancel()


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_dead_bootstrap_peer_is_redialled_until_it_comes_up():
    late_key = create_new_key_pair()
    late_id = peer_id_of(late_key)
    port = _free_loopback_port()
    late_addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{late_id}"
    with trio.fail_after(25):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, peers=[late_addr], dial_backoff_initial=0.2, dial_backoff_max=0.5)
            await trio.sleep(1.0)  # several failed dials; run() must carry on regardless
            assert a.counters.get("dial_failed", 0) >= 2
            assert a.service.connected_peers() == []
            late = await start_node(nursery, key_pair=late_key, listen=f"/ip4/127.0.0.1/tcp/{port}")
            with trio.fail_after(10):
                while late_id not in a.service.connected_peers():
                    await trio.sleep(0.05)
            await wait_for_mesh([a, late])
            assert await late.service.publish(b"late but here")
            [message] = await receive_all(a, 1)
            assert (message.sender, message.data) == (late_id, b"late but here")
            nursery.cancel_scope.cancel()


async def test_plaintext_only_dialler_is_refused():
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery)
            key_pair = create_new_key_pair()
            plaintext = {PLAINTEXT_PROTOCOL_ID: InsecureTransport(key_pair)}
            async with raw_host(sec_opt=plaintext) as dialler:
                refused = False
                with trio.move_on_after(8):
                    try:
                        await dialler.connect(info_from_p2p_addr(multiaddr.Multiaddr(a.addr)))
                    except Exception:
                        refused = True
                assert refused
                assert dialler.get_id().to_base58() not in a.service.connected_peers()
            nursery.cancel_scope.cancel()


async def run_node_in(scope, key_pair, port, task_status=trio.TASK_STATUS_IGNORED):
    """A node on a fixed port that stops (closing its host) when `scope` is cancelled."""
    with scope:
        async with trio.open_nursery() as nursery:
            node = await start_node(nursery, key_pair=key_pair, listen=f"/ip4/127.0.0.1/tcp/{port}")
            task_status.started(node)
            await trio.sleep_forever()


async def test_bootstrap_peer_that_restarts_is_redialled():
    late_key = create_new_key_pair()
    port = _free_loopback_port()
    with trio.fail_after(25):
        async with trio.open_nursery() as nursery:
            late_scope = trio.CancelScope()
            late = await nursery.start(run_node_in, late_scope, late_key, port)
            a = await start_node(nursery, peers=[late.addr], dial_backoff_initial=0.2, dial_backoff_max=0.5)
            await wait_for_mesh([a, late])
            late_scope.cancel()  # late's host closes its connections, so a notices at once
            with trio.fail_after(5):
                while late.service.peer_id in a.service.connected_peers():
                    await trio.sleep(0.05)
            late = await nursery.start(run_node_in, trio.CancelScope(), late_key, port)
            await wait_for_mesh([a, late])
            assert await late.service.publish(b"back again")
            [message] = await receive_all(a, 1)
            assert message.data == b"back again"
            nursery.cancel_scope.cancel()


ME = create_new_key_pair()


def _delivery(capacity):
    send, receive = trio.open_memory_channel(capacity)
    counters: dict[str, int] = {}
    delivery = Delivery(ID.from_pubkey(ME.public_key), (TOPIC,), send, counter(counters))
    return delivery, receive, counters


def _deliver(delivery, msg):
    delivery.deliver(msg, msg.from_id + msg.seqno)  # the message id, as pubsub would give it


def _message(key_pair, seqno, data=b"x"):
    return rpc_pb2.Message(
        data=data,
        topicIDs=[TOPIC],
        from_id=ID.from_pubkey(key_pair.public_key).to_bytes(),
        seqno=seqno.to_bytes(8, "big"),
    )


def test_replayed_message_is_delivered_once():
    delivery, inbox, counters = _delivery(8)
    peer = create_new_key_pair()
    _deliver(delivery, _message(peer, 1))
    _deliver(delivery, _message(peer, 1))  # e.g. an mcache replay after libp2p's 120 s seen-TTL
    _deliver(delivery, _message(peer, 2))
    assert [m.data for m in (inbox.receive_nowait(), inbox.receive_nowait())] == [b"x", b"x"]
    assert counters == {"received": 2, "duplicate": 1}


def test_own_messages_are_not_delivered():
    delivery, inbox, counters = _delivery(8)
    _deliver(delivery, _message(ME, 1))
    assert counters == {}


def test_full_inbox_drops_instead_of_blocking():
    delivery, inbox, counters = _delivery(1)
    peer = create_new_key_pair()
    for seqno in range(3):
        _deliver(delivery, _message(peer, seqno))
    assert counters == {"received": 3, "inbox_channel_full": 2}
