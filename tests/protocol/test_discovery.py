"""Peer discovery (`/sapo/peers/1`): what a record must be to be dialled, the bounded wire, and
a real star of 7 hosts on 127.0.0.1 whose hub meshes only 2 of its 6 leaves: without
discovery the leaves stay leaves, with it they find each other and every message reaches
everyone."""

import msgpack
import multiaddr
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.envelope import seal_record
from libp2p.peer.id import ID
from libp2p.peer.peer_record import PeerRecord

from sapo.protocol.exchange.discovery import PeerTable
from sapo.protocol.wire.peer_records import (
    MAX_ADDRS_PER_RECORD,
    RECORDS_PER_RESPONSE,
    BadRecord,
    KnownPeer,
    check_record,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    seal_own_record,
)
from tests.support.gossip import TOPIC, start_node

M = multiaddr.Multiaddr


def sealed(key, addrs, peer_id=None, seq=None) -> bytes:
    record = PeerRecord(peer_id or ID.from_pubkey(key.public_key), [M(a) for a in addrs], seq)
    return seal_record(record, key.private_key).marshal_envelope()


def test_own_record_round_trips_as_a_dialable_address():
    key = create_new_key_pair(b"\x01" * 32)
    me = ID.from_pubkey(key.public_key)
    envelope = seal_own_record(key, [M(f"/ip4/127.0.0.1/tcp/4001/p2p/{me}")])
    entry = check_record(envelope, "127.0.0.1", expect_peer=me)
    assert entry.peer_id == me
    assert [str(a) for a in entry.addrs] == [f"/ip4/127.0.0.1/tcp/4001/p2p/{me}"]


def test_a_record_signed_by_someone_else_is_refused():
    alice, mallory = create_new_key_pair(b"\x02" * 32), create_new_key_pair(b"\x03" * 32)
    alice_id = ID.from_pubkey(alice.public_key)
    forged = sealed(mallory, ["/ip4/10.0.0.9/tcp/4001"], peer_id=alice_id)  # names alice, signed by mallory
    with pytest.raises(BadRecord, match="signed by"):
        check_record(forged, None)
    honest = sealed(alice, ["/ip4/10.0.0.9/tcp/4001"])
    with pytest.raises(BadRecord, match="sent as the record of"):  # a peer must send its own record
        check_record(honest, None, expect_peer=ID.from_pubkey(mallory.public_key))
    tampered = bytearray(honest)
    tampered[-70] ^= 1  # inside the payload or signature
    with pytest.raises(BadRecord):
        check_record(bytes(tampered), None)
    for garbage in (b"", b"\x00" * 10, b"x" * 5000, "text"):
        with pytest.raises(BadRecord):
            check_record(garbage, None)


def test_only_tcp_addresses_of_the_signer_are_kept():
    key, other = create_new_key_pair(b"\x04" * 32), create_new_key_pair(b"\x05" * 32)
    me, them = ID.from_pubkey(key.public_key), ID.from_pubkey(other.public_key)
    envelope = sealed(
        key,
        [
            "/ip4/10.0.0.1/tcp/4001",
            f"/ip4/10.0.0.2/tcp/4001/p2p/{me}",
            f"/ip4/10.0.0.3/tcp/4001/p2p/{them}",  # someone else's id: dropped
            "/ip4/10.0.0.4/udp/4001/quic-v1",  # not tcp
            "/ip6/::1/tcp/4001",  # loopback while the peer was seen on 10.0.0.1: not on our machine
            "/ip4/224.0.0.1/tcp/4001",  # multicast
            "/dns4/example.com/tcp/4001",  # no names: they would make us resolve whatever we are told
        ],
    )
    entry = check_record(envelope, "10.0.0.1")
    assert [str(a) for a in entry.addrs] == [f"/ip4/10.0.0.1/tcp/4001/p2p/{me}", f"/ip4/10.0.0.2/tcp/4001/p2p/{me}"]
    with pytest.raises(BadRecord, match="no dialable"):
        check_record(sealed(key, ["/ip4/10.0.0.4/udp/4001/quic-v1"]), None)
    many = sealed(key, [f"/ip4/10.0.1.{i}/tcp/4001" for i in range(20)])
    assert len(check_record(many, None).addrs) == MAX_ADDRS_PER_RECORD


def test_unspecified_listen_address_takes_the_observed_ip_only_first_hand():
    key = create_new_key_pair(b"\x06" * 32)
    me = ID.from_pubkey(key.public_key)
    envelope = sealed(key, ["/ip4/0.0.0.0/tcp/4001"])
    # its own record, over its own connection: the IP that connection came from is its address
    first_hand = check_record(envelope, "172.18.0.7", expect_peer=me)
    assert [str(a) for a in first_hand.addrs] == [f"/ip4/172.18.0.7/tcp/4001/p2p/{me}"] and first_hand.first_hand
    # a third party's hint is only a dial candidate, after whatever the owner signed (issue #41)
    passed_on = check_record(envelope, "172.18.0.7")
    assert passed_on.addrs == [] and not passed_on.first_hand
    assert [str(a) for a in passed_on.dial_addrs] == [f"/ip4/172.18.0.7/tcp/4001/p2p/{me}"]
    for hint in (None, "::1", "not an ip", "0.0.0.0"):
        with pytest.raises(BadRecord):
            check_record(envelope, hint)
        with pytest.raises(BadRecord):
            check_record(envelope, hint, expect_peer=me)


def test_relayed_addresses_are_kept_with_their_relay_and_never_take_the_hint():
    key, relay_key = create_new_key_pair(b"\x07" * 32), create_new_key_pair(b"\x08" * 32)
    me, relay = ID.from_pubkey(key.public_key), ID.from_pubkey(relay_key.public_key)
    other = ID.from_pubkey(create_new_key_pair(b"\x09" * 32).public_key)
    envelope = sealed(
        key,
        [
            f"/ip4/198.51.100.2/tcp/4001/p2p/{relay}/p2p-circuit",  # what a NATed node advertises
            f"/ip4/198.51.100.3/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{me}",  # the same, with our id
            f"/ip4/198.51.100.4/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{other}",  # someone else at the end
            f"/ip4/0.0.0.0/tcp/4001/p2p/{relay}/p2p-circuit",  # the hint is our IP, not the relay's
            f"/ip4/198.51.100.5/tcp/4001/p2p/{me}/p2p-circuit",  # relaying through ourselves
            f"/ip4/127.0.0.1/tcp/4001/p2p/{relay}/p2p-circuit",  # loopback relay of a remote peer
            "/ip4/198.51.100.6/tcp/4001/p2p-circuit",  # no relay id
        ],
    )
    entry = check_record(envelope, "10.66.0.2")
    assert [str(a) for a in entry.addrs] == [
        f"/ip4/198.51.100.2/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{me}",
        f"/ip4/198.51.100.3/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{me}",
    ]
    # our own record keeps the relay's id when the /p2p/<us> suffix is stripped
    own = seal_own_record(key, [M(f"/ip4/198.51.100.2/tcp/4001/p2p/{relay}/p2p-circuit")])
    assert [str(a) for a in check_record(own, None, expect_peer=me).addrs] == [entry.addrs[0].__str__()]


def test_wire_round_trip_and_refusals():
    key = create_new_key_pair(b"\x07" * 32)
    own = seal_own_record(key, [M("/ip4/127.0.0.1/tcp/1")])
    assert decode_request(encode_request(own)[4:]) == own
    peers = [(own, "10.0.0.1"), (own, None)]
    assert decode_response(encode_response(own, peers)[4:]) == (own, peers)
    bad = [
        b"\xc1",  # not msgpack
        msgpack.packb([1, 2]),
        msgpack.packb({"v": 2, "self": own}),
        msgpack.packb({"v": True, "self": own}),
        msgpack.packb({"v": 1, "selves": own}),
        msgpack.packb({"v": 1, "self": own, **{f"k{i}": i for i in range(16)}}),  # over MAX_FRAME_KEYS
        msgpack.packb({"v": 1, "self": "a string"}),
        msgpack.packb({"v": 1, "self": b"x" * 3000}),
    ]
    for payload in bad:
        with pytest.raises(BadRecord):
            decode_request(payload)
    # a key a later release adds is skipped (protocol/README.md, "Compatibility")
    assert decode_request(msgpack.packb({"v": 1, "self": own, "later": {"x": [1]}})) == own
    too_many = msgpack.packb({"v": 1, "self": own, "peers": [[own, None]] * (RECORDS_PER_RESPONSE + 1)})
    for payload in (too_many, msgpack.packb({"v": 1, "self": own, "peers": [[own, 5]]})):
        with pytest.raises(BadRecord):
            decode_response(payload)


def test_peer_table_is_bounded_and_backs_off():
    table = PeerTable(max_peers=3)
    keys = [create_new_key_pair(bytes([10 + i]) * 32) for i in range(5)]
    ids = [ID.from_pubkey(k.public_key) for k in keys]
    for peer in ids:
        assert table.add(KnownPeer(peer, [], 1, b"e", None))
    assert len(table) == 3 and ids[0] not in table and ids[4] in table
    assert not table.add(KnownPeer(ids[4], [], 0, b"older", None))
    assert table.records_of([ids[4]]) == [(b"e", None)]  # an older record does not replace a newer one
    shared = table.records_to_share([ids[4]])  # the connected one, and the others from the table
    assert shared[0] == (b"e", None) and len(shared) == 3
    table.dial_failed(ids[4], now=0.0)
    assert ids[4] not in {e.peer_id for e in table.candidates(1.0, skip=lambda p: False)}
    assert ids[4] in {e.peer_id for e in table.candidates(10.0, skip=lambda p: False)}
    for _ in range(4):
        table.dial_failed(ids[4], now=0.0)
    assert ids[4] not in table


# --- a real star ----------------------------------------------------------------------------------

LEAVES = 6
# The hub meshes at most 2 peers; a leaf keeps the defaults and wants 3 connections.
HUB = dict(mesh_degree=2, mesh_degree_low=1, mesh_degree_high=2)


async def start_star(nursery, discover: int):
    hub = await start_node(nursery, discover_peers=discover, **HUB)
    leaves = [await start_node(nursery, peers=[hub.addr], discover_peers=discover) for _ in range(LEAVES)]
    return hub, leaves


async def smallest_mesh(node, seconds: float = 2.5) -> int:
    """The node's mesh size, low point over a few heartbeats (GRAFTs are accepted in between and
    pruned down to D at the next heartbeat)."""
    sizes = []
    end = trio.current_time() + seconds
    while trio.current_time() < end:
        sizes.append(len(node.service.pubsub.router.mesh.get(TOPIC, ())))
        await trio.sleep(0.02)
    return min(sizes)


async def test_without_discovery_the_leaves_only_know_the_hub():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            hub, leaves = await start_star(nursery, discover=0)
            with trio.fail_after(15):
                while not all(leaf.service.connected_peers() for leaf in leaves):
                    await trio.sleep(0.1)
            await trio.sleep(2)  # a few heartbeats, in which no leaf learns of another
            assert all(leaf.service.connected_peers() == [hub.service.peer_id] for leaf in leaves)
            assert await smallest_mesh(hub) <= 2  # at every heartbeat 4 of 6 leaves are pruned from it
            nursery.cancel_scope.cancel()


async def test_discovered_peers_get_connected_and_every_message_reaches_everyone():
    with trio.fail_after(45):
        async with trio.open_nursery() as nursery:
            hub, leaves = await start_star(nursery, discover=3)
            nodes = [hub, *leaves]

            # A connection is in the swarm a moment before the dial that made it returns and is
            # counted (under load, every dial can still be finishing when the last one appears).
            def settled() -> bool:
                return (
                    all(len(leaf.service.connected_peers()) >= 3 for leaf in leaves)
                    and sum(leaf.counters.get("discovery_connected", 0) for leaf in leaves) > 0
                )

            with trio.move_on_after(20):
                while not settled():
                    await trio.sleep(0.2)
            assert settled(), [leaf.counters for leaf in leaves]
            for leaf in leaves:  # each leaf now knows other leaves, not just the hub
                others = set(leaf.service.connected_peers()) - {hub.service.peer_id}
                assert len(others) >= 2, leaf.counters
            assert await smallest_mesh(hub) <= 2  # the hub still meshes only 2: the leaves carry the rest
            await trio.sleep(1)  # heartbeats: the leaves graft each other

            for i, node in enumerate(nodes):
                assert await node.service.publish(b"from %d" % i)
            expected = {b"from %d" % i for i in range(len(nodes))}
            with trio.fail_after(15):
                for i, node in enumerate(nodes):
                    got = set()
                    while got != expected - {b"from %d" % i}:
                        got.add((await node.inbox.receive()).data)
            counters = [n.counters for n in nodes]
            print("\n" + "\n".join(str(c) for c in counters))
            assert sum(c.get("records_rejected", 0) for c in counters) == 0
            nursery.cancel_scope.cancel()
