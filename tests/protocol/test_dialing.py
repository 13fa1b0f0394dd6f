"""Dialling a peer the peerstore has forgotten the addresses of, on real hosts on 127.0.0.1.

py-libp2p 0.8.1's peerstore raises `PeerStoreError` from `clear_addrs` when a peer's addresses
have expired while its signed peer record is held (identify, gossip and relays all store one). The
dialer clears a peer's addresses before every dial, so the first dial of an author last heard of
more than a TTL ago raised out of the fetcher and ended the node (bench/wild.py found it: 64 nodes
with churn, after 20 minutes)."""

import time

import multiaddr
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.peer.peerstore import PeerStore, PeerStoreError, create_signed_peer_record

from sapo.protocol.reach.dialing import dial_direct
from sapo.protocol.toolkit.hosts import known_addrs, new_noise_host
from tests.support.hosts import run_host

LOOPBACK = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")


def hold_expired_record(peerstore: PeerStore, key_pair, addrs: list[multiaddr.Multiaddr]) -> None:
    """The peerstore holds the peer's signed record, and the peer's addresses have expired."""
    record = create_signed_peer_record(key_pair_id(key_pair), addrs, key_pair.private_key)
    assert peerstore.consume_peer_record(record, 60)
    data = peerstore.peer_data_map[key_pair_id(key_pair)]
    data.last_identified = int(time.time()) - 3600  # its TTL of 60 s ran out an hour ago


def key_pair_id(key_pair) -> ID:
    return ID.from_pubkey(key_pair.public_key)


def test_the_library_raises_where_the_dialer_clears():
    """The condition itself, in the library alone: if 0.8.1 stops raising, this says so."""
    peerstore, key_pair = PeerStore(), create_new_key_pair()
    hold_expired_record(peerstore, key_pair, [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/4001")])
    with pytest.raises(PeerStoreError, match="expired"):
        peerstore.clear_addrs(key_pair_id(key_pair))


async def test_a_peer_whose_addresses_expired_is_dialled_again():
    them_key = create_new_key_pair()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            us, them = new_noise_host(create_new_key_pair(), [LOOPBACK]), new_noise_host(them_key, [LOOPBACK])
            for host in (us, them):
                await nursery.start(run_host, host)
            addrs = [a.decapsulate(multiaddr.Multiaddr(f"/p2p/{them.get_id()}")) for a in them.get_addrs()]
            hold_expired_record(us.get_peerstore(), them_key, addrs)
            assert known_addrs(us, them.get_id()) == []  # expired: none, and no exception

            assert await dial_direct(us, PeerInfo(them.get_id(), addrs)) is None
            assert us.get_network().get_connections(them.get_id())
            assert any(str(a).startswith(str(addrs[0])) for a in known_addrs(us, them.get_id()))
            nursery.cancel_scope.cancel()


def test_known_addrs_of_a_stranger_is_empty():
    host = new_noise_host(create_new_key_pair(), [LOOPBACK])
    assert known_addrs(host, key_pair_id(create_new_key_pair())) == []
