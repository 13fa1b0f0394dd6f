"""AutoNAT on real hosts on 127.0.0.1: 0.8.1's dial-back does not dial; ours does."""

import logging

import multiaddr
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.host.autonat.autonat import AutoNATService
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID

from sapo.protocol.reach import reachability
from sapo.protocol.reach.reachability import Reachability, ReachabilityService, _DialBackAutoNAT
from sapo.protocol.toolkit.peer_gate import PeerGate
from tests.support.hosts import two_connected_hosts


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_address() -> bytes:
    return multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{free_port()}").to_bytes()


async def test_stock_autonat_calls_an_address_nobody_listens_on_reachable():
    # Why reachability.py replaces the dial-back: 0.8.1's host.connect() finds the connection
    # the request came over and reports success without dialling anything.
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            server, client = await two_connected_hosts(nursery)
            AutoNATService(server)  # serves /libp2p/autonat/1.0.0
            status, _ = await AutoNATService(client, serve=False).query_server(server.get_id(), addrs=[dead_address()])
            assert status == Message.OK
            nursery.cancel_scope.cancel()


async def test_our_dial_back_really_dials_and_answers_a_peer_once_per_interval():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server, client = await two_connected_hosts(nursery)
            counters: dict[str, int] = {}
            now = [0.0]
            ReachabilityService(
                server,
                mode="auto",
                interval=60,
                gate=PeerGate(count=lambda name: counters.__setitem__(name, counters.get(name, 0) + 1)),
                on_change=lambda status: None,
                clock=lambda: now[0],
            ).attach()
            asker = AutoNATService(client, serve=False)
            live = client.get_transport_addrs()[0].to_bytes()
            status, _ = await asker.query_server(server.get_id(), addrs=[dead_address()])
            assert status == Message.E_DIAL_ERROR
            with pytest.raises(Exception):  # noqa: B017 - asked again at once: the stream is reset, nothing dialled
                await asker.query_server(server.get_id(), addrs=[live])
            now[0] += reachability.MIN_ASK_INTERVAL_SECONDS
            status, address = await asker.query_server(server.get_id(), addrs=[live])
            assert status == Message.OK and address == live
            assert counters == {"autonat_served": 2, "autonat_refused": 1}
            nursery.cancel_scope.cancel()


async def test_a_node_learns_it_is_public_and_a_refused_server_gives_no_verdict():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server, client = await two_connected_hosts(nursery)
            ReachabilityService(
                server,
                mode="auto",
                interval=60,
                gate=PeerGate(refusal=lambda peer: "not_allowed"),
                on_change=lambda status: None,
            ).attach()
            changes: list[Reachability] = []
            # the server is our bootstrap peer: asked at once, although just connected
            service = ReachabilityService(
                client,
                mode="auto",
                interval=60,
                gate=PeerGate(),
                on_change=changes.append,
                bootstrap=lambda peer: peer == server.get_id(),
            )
            assert await service.check_once() == 0  # the server refuses us: no verdict either way
            assert service.status is Reachability.unknown and not changes
            ReachabilityService(
                server,
                mode="auto",
                interval=60,
                gate=PeerGate(),
                on_change=lambda status: None,
            ).attach()
            service._next_ask.clear()
            assert await service.check_once() == 1
            assert service.status is Reachability.public and changes == [Reachability.public]
            nursery.cancel_scope.cancel()


def test_the_server_dials_the_requesters_ip_only_and_fills_in_an_unspecified_one():
    addrs = [
        multiaddr.Multiaddr(a).to_bytes()
        for a in (
            "/ip4/0.0.0.0/tcp/4001",  # listening everywhere: the port, at the IP we see
            "/ip4/203.0.113.9/tcp/4002",  # someone else's IP: never (amplification)
            "/ip4/198.51.100.7/tcp/4003",  # the requester's own: yes
            "/ip6/::/tcp/4004",  # wrong family for this requester
            "/ip4/198.51.100.7/udp/4005/quic-v1",  # not TCP
        )
    ]
    dialable = [str(multiaddr.Multiaddr(a)) for a in _DialBackAutoNAT._filter_by_observed_ip(addrs, "198.51.100.7")]
    assert dialable == ["/ip4/198.51.100.7/tcp/4001", "/ip4/198.51.100.7/tcp/4003"]
    assert _DialBackAutoNAT._filter_by_observed_ip(addrs, None) == []


async def test_a_dial_back_proves_who_answered_and_leaves_no_error_in_the_requesters_log(libp2p_records):
    # 0.8.1's requester logs "ERROR libp2p.network.swarm: fail to upgrade mux for peer ..." for a
    # dial-back that completes the Noise handshake and then hangs up, once per check: the first
    # line of every `make run`. Ours stops after the requester's half of the handshake.
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server, client = await two_connected_hosts(nursery)
            ReachabilityService(
                server,
                mode="auto",
                interval=60,
                gate=PeerGate(),
                on_change=lambda status: None,
            ).attach()
            live = client.get_transport_addrs()[0]
            status, _ = await AutoNATService(client, serve=False).query_server(server.get_id(), addrs=[live.to_bytes()])
            assert status == Message.OK
            await trio.sleep(1.0)  # the requester's swarm gives up on the dial-back's connection
            someone_else = create_new_key_pair().public_key
            with pytest.raises(Exception):  # noqa: B017 - the same address under another peer id: Noise refuses it
                await reachability.dial_back(server.get_network(), live, ID.from_pubkey(someone_else))
            nursery.cancel_scope.cancel()
    loud = [(r.name, r.levelname, r.getMessage()[:100]) for r in libp2p_records if r.levelno >= logging.WARNING]
    assert not loud, loud
