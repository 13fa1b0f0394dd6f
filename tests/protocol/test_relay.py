"""Circuit Relay v2 and hole punching between real networks (protocol/network.py) on 127.0.0.1.

On loopback nothing is behind NAT, so the "NATed" peers are told they are private
(`reachability="private"`): they reserve a slot on the relay and advertise only their relayed
address. Their discovery is off, since on loopback it would find and dial their real, reachable
listen addresses first; here the circuit is dialled as discovery would dial a relayed record.
Discovery meeting peers through relayed records, with real NATs, is tests/hardening/test_nat.py.
"""

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from sapo.protocol.reach import relay_guards, relayed_links
from sapo.protocol.reach.relay import RelayService, relay_limits
from sapo.protocol.toolkit.hosts import new_noise_host
from sapo.protocol.toolkit.peer_gate import PeerGate
from tests.support.gossip import receive_all, start_node
from tests.support.relay import PRIVATE, dial_through_relay, kinds, wait_until


async def relay_and_two_private(nursery, psk=None, **private):
    relay = await start_node(nursery, relay="on", reachability="public", psk=psk)
    private = {**private, "psk": psk}
    a = await start_node(nursery, peers=[relay.addr], **{**PRIVATE, **private})
    b = await start_node(nursery, peers=[relay.addr], **{**PRIVATE, **private})
    await wait_until(lambda: a.service.status().relayed_addrs and b.service.status().relayed_addrs, 20)
    return relay, a, b


async def test_private_peers_meet_through_the_relay_and_gossip_over_the_circuit():
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            relay, a, b = await relay_and_two_private(nursery)
            assert relay.service.status().relaying and not a.service.status().relaying
            # a private peer's record names only its relayed address: its own would not answer
            (address,) = a.service.status().advertised_addrs
            assert str(address) == f"{relay.addr}/p2p-circuit", address
            await dial_through_relay(a, b)
            await wait_until(lambda: kinds(a, b) == {True} and kinds(b, a) == {True}, 30)
            await trio.sleep(2)  # heartbeats: the mesh takes the new link
            assert await a.service.publish(b"a over the circuit")
            assert await b.service.publish(b"b over the circuit")
            assert [m.data for m in await receive_all(b, 1)] == [b"a over the circuit"]
            assert [m.data for m in await receive_all(a, 1)] == [b"b over the circuit"]
            assert relay.counters.get("relay_circuits_served", 0) >= 1, relay.counters
            assert a.counters.get("relay_reserved") == 1 and b.counters.get("relay_reserved") == 1
            nursery.cancel_scope.cancel()


async def test_hole_punching_adds_a_direct_connection_to_the_relayed_one():
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            _, a, b = await relay_and_two_private(nursery, hole_punching=True)
            await dial_through_relay(a, b)
            # DCUtR first tries the peer's own addresses, which on loopback answer at once
            await wait_until(lambda: False in kinds(a, b), 30)
            await trio.sleep(2)
            assert await a.service.publish(b"after the punch")
            assert [m.data for m in await receive_all(b, 1)] == [b"after the punch"]
            nursery.cancel_scope.cancel()


async def circuits_from_one_peer_survive_each_other(stock: bool, monkeypatch) -> bool:
    """a holds circuits to b and c through the relay; a closes the one to b. Does a-c live on?"""
    if stock:  # 0.8.1's _relay_data, which closes "the circuit of peer X" by peer id
        monkeypatch.setattr(
            relay_guards.GuardedRelayProtocol, "_relay_data", relay_guards.CircuitV2Protocol._relay_data
        )
    # a closes its link to b itself: its recovery (relayed_links.py) would dial b again at once,
    # and the new circuit would change which streams the stock relay's bookkeeping points at
    monkeypatch.setattr(relayed_links.RelayedLinks, "_closed", lambda self, link, nursery: None)
    async with trio.open_nursery() as nursery:
        relay, b, c = await relay_and_two_private(nursery)
        a = await start_node(nursery, peers=[relay.addr], **PRIVATE)
        for target in (b, c):
            await dial_through_relay(a, target)
        await wait_until(lambda: kinds(a, b) == {True} and kinds(a, c) == {True}, 20)
        network = a.service.host.get_network()
        to_c = [c_ for c_ in network.get_connections(ID.from_base58(c.service.peer_id)) if not c_.is_closed]
        for connection in network.get_connections(ID.from_base58(b.service.peer_id)):
            await connection.close()
        await trio.sleep(2)
        # that very connection: a new one would hide the cut
        alive = all(not connection.is_closed for connection in to_c)
        nursery.cancel_scope.cancel()
    return alive


async def test_closing_one_circuit_leaves_the_same_peers_other_circuits_open(monkeypatch):
    with trio.fail_after(60):
        assert await circuits_from_one_peer_survive_each_other(stock=False, monkeypatch=monkeypatch)


async def test_stock_relay_closes_another_circuit_of_the_same_peer(monkeypatch):
    # Why GuardedRelayProtocol overrides _relay_data. If this starts failing, 0.8.x fixed it.
    with trio.fail_after(60):
        assert not await circuits_from_one_peer_survive_each_other(stock=True, monkeypatch=monkeypatch)


async def test_a_relayed_dial_never_goes_through_a_refused_relay():
    key_pair = create_new_key_pair()
    host = new_noise_host(key_pair, [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")])
    refused = ID.from_pubkey(create_new_key_pair().public_key)
    target = ID.from_pubkey(create_new_key_pair().public_key)
    asked: list[ID] = []

    def may_use(peer: ID) -> bool:
        asked.append(peer)
        return peer != refused

    service = RelayService(
        host,
        relay="off",
        limits=relay_limits(reservations=1, circuits_per_peer=1, circuit_bytes=1, circuit_seconds=1),
        relays_to_reserve=0,
        hole_punching=False,
        preferred_relays=list,
        gate=PeerGate(refusal=lambda peer: None if may_use(peer) else "banned"),
    )
    circuit = multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/9/p2p/{refused}/p2p-circuit")
    error = await service.dial(PeerInfo(target, [circuit]))
    assert isinstance(error, ConnectionError) and "no usable relayed address" in str(error)
    assert asked == [refused]  # refused before any connection was attempted (the host is not even running)


async def test_a_relays_refusal_is_forgotten_once_its_backoff_has_run_out():
    from sapo.protocol.reach.relay import RESERVE_REFUSED_BACKOFF_SECONDS

    now = [1000.0]
    host = new_noise_host(create_new_key_pair(), [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")])
    service = RelayService(
        host,
        relay="off",
        limits=relay_limits(reservations=1, circuits_per_peer=1, circuit_bytes=1, circuit_seconds=1),
        relays_to_reserve=1,
        hole_punching=False,
        preferred_relays=list,
        gate=PeerGate(),
        clock=lambda: now[0],
    )
    refusers = [ID.from_pubkey(create_new_key_pair().public_key) for _ in range(3)]
    for i, relay in enumerate(refusers):  # as _reserve_more notes a refusal, a minute apart
        service._refused_until[relay] = now[0] + 60 * i + RESERVE_REFUSED_BACKOFF_SECONDS
    now[0] += RESERVE_REFUSED_BACKOFF_SECONDS + 1
    service._prune()
    assert set(service._refused_until) == set(refusers[1:])
    now[0] += 120
    service._prune()
    assert service._refused_until == {}


async def test_circuits_work_in_a_private_swarm_and_outsiders_cannot_reserve():
    # With a swarm key (pnet), both ends of a circuit must protect it: 0.8.1 does so only for
    # the inbound end of a relayed connection (RelayService dials through ProtectedCircuits).
    psk = "ab" * 32
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            relay, a, b = await relay_and_two_private(nursery, psk=psk)
            await dial_through_relay(a, b)
            await wait_until(lambda: kinds(a, b) == {True}, 20)
            await trio.sleep(2)
            assert await a.service.publish(b"inside the private swarm")
            assert [m.data for m in await receive_all(b, 1)] == [b"inside the private swarm"]
            outsider = await start_node(nursery, peers=[relay.addr], **PRIVATE)  # no key
            await trio.sleep(3)
            assert not outsider.service.status().relayed_addrs and not outsider.service.connected_peers()
            nursery.cancel_scope.cancel()


async def test_a_circuit_cut_at_the_relays_byte_limit_is_dialled_again():
    # Discovery is off here (PRIVATE): only relayed_links.py can bring the link back.
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            relay = await start_node(nursery, relay="on", reachability="public", relay_max_circuit_bytes=48 * 1024)
            a = await start_node(nursery, peers=[relay.addr], **PRIVATE)
            b = await start_node(nursery, peers=[relay.addr], **PRIVATE)
            await wait_until(lambda: a.service.status().relayed_addrs and b.service.status().relayed_addrs, 20)
            await dial_through_relay(a, b)
            await wait_until(lambda: kinds(a, b) == {True}, 20)
            await trio.sleep(2)
            received = 0
            for i in range(40):  # 4 KB a message: a circuit carries about ten
                assert await a.service.publish(bytes([i]) * 4000)
                received += len(await receive_all(b, 1, timeout=15))
                await trio.sleep(0.1)
            assert relay.counters.get("relay_circuits_limited", 0) >= 2, relay.counters
            assert a.counters.get("relayed_links_recovered", 0) >= 2, a.counters
            assert received == 40
            nursery.cancel_scope.cancel()


def test_relays_that_cut_circuits_early_are_tried_last():
    now = [0.0]
    cuts = relayed_links.RelayCuts(clock=lambda: now[0], memory=100.0)
    r1, r2, r3 = (ID.from_pubkey(create_new_key_pair().public_key) for _ in range(3))
    cuts.record(r1)
    cuts.record(r1)
    cuts.record(r2)
    assert cuts.order([r1, r2, r3]) == [r3, r2, r1]
    assert cuts.order([r2, r3]) == [r3, r2]
    now[0] = 150.0  # forgotten after `memory` seconds
    assert cuts.order([r1, r2, r3]) == [r1, r2, r3]


async def test_a_bootstrap_relay_that_refused_is_asked_again_sooner(monkeypatch):
    # A public bootstrap relays only once it has found itself public (reachability.py: its peers
    # must have stayed a while first), so the NATed peers that came first are refused at first.
    from sapo.protocol.reach import relay as relay_module
    from sapo.protocol.reach.relay import (
        BOOTSTRAP_REFUSED_BACKOFF_SECONDS,
        HOP_PROTOCOL_ID,
        RESERVE_REFUSED_BACKOFF_SECONDS,
    )

    now = [1000.0]
    host = new_noise_host(create_new_key_pair(), [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")])
    boot, other = (ID.from_pubkey(create_new_key_pair().public_key) for _ in range(2))
    host.get_peerstore().add_protocols(other, [HOP_PROTOCOL_ID])
    monkeypatch.setattr(relay_module, "direct_peers", lambda host: [boot, other])
    service = RelayService(
        host,
        relay="off",
        limits=relay_limits(reservations=1, circuits_per_peer=1, circuit_bytes=1, circuit_seconds=1),
        relays_to_reserve=2,
        hole_punching=False,
        preferred_relays=lambda: [boot],
        gate=PeerGate(),
        clock=lambda: now[0],
    )
    service.relay_address = lambda relay: multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/9")

    async def refused(relay):
        return None

    service._reserve = refused
    assert not await service._reserve_more(2)
    assert service._refused_until == {
        boot: now[0] + BOOTSTRAP_REFUSED_BACKOFF_SECONDS,
        other: now[0] + RESERVE_REFUSED_BACKOFF_SECONDS,
    }
