"""Reachability cannot be flipped by a few fake peers: a verdict counts only from an established
server (a bootstrap peer, or one connected `MIN_SERVER_AGE_SECONDS`), and once per network group
(toolkit/hosts.py's network_group). The hosts here are stand-ins that say which peers are connected,
from which address, since when; the answers are whatever each peer would say."""

import time

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from sapo.protocol.reach.reachability import MIN_SERVER_AGE_SECONDS, Reachability, ReachabilityService
from sapo.protocol.toolkit.hosts import network_group
from sapo.protocol.toolkit.peer_gate import PeerGate


def test_network_groups():
    assert network_group("8.8.8.8") == network_group("8.8.200.1") == "8.8.0.0/16"
    assert network_group("8.9.0.1") != network_group("8.8.0.1")
    assert network_group("2001:4860:1::1") == network_group("2001:4860:ffff::2") == "2001:4860::/32"
    assert network_group("::ffff:8.8.4.4") == "8.8.0.0/16"  # IPv4 seen over an IPv6 socket
    # Not globally routable: our host, LAN, container network or carrier NAT; one voice together.
    for local in (
        "127.0.0.1",
        "10.66.1.2",
        "192.168.1.5",
        "172.17.0.3",
        "100.64.0.9",
        "169.254.1.1",
        "::1",
        "fd00::1",
        "198.51.100.7",
        "not an ip",
    ):
        assert network_group(local) == "local", local


class Connection:
    def __init__(self, ip: str, age: float) -> None:
        self.is_closed = False
        self._created_at = time.time() - age
        self._addresses = [multiaddr.Multiaddr(f"/ip4/{ip}/tcp/4001")]

    def get_transport_addresses(self):
        return self._addresses


class Host:
    """The little of a libp2p host that ReachabilityService reads: who is connected, how."""

    def __init__(self) -> None:
        self.connections: dict[ID, Connection] = {}

    def add(self, ip: str, age: float) -> ID:
        peer = ID.from_pubkey(create_new_key_pair().public_key)
        self.connections[peer] = Connection(ip, age)
        return peer

    def get_connected_peers(self):
        return list(self.connections)

    def get_network(self):
        return self

    def get_connections(self, peer):
        return [self.connections[peer]] if peer in self.connections else []

    def get_peerstore(self):
        return None

    def get_transport_addrs(self):
        return [multiaddr.Multiaddr("/ip4/0.0.0.0/tcp/4001")]


def service_with_answers(host: Host, answers: dict[ID, bool], bootstrap=()) -> tuple[ReachabilityService, dict]:
    asked: dict[ID, int] = {}
    service = ReachabilityService(
        host,
        mode="auto",
        interval=0.0,
        gate=PeerGate(),
        on_change=lambda status: None,
        bootstrap=lambda peer: peer in bootstrap,
    )

    async def ask(server: ID) -> bool | None:
        asked[server] = asked.get(server, 0) + 1
        return answers[server]

    service._ask = ask
    return service, asked


async def settle(service: ReachabilityService, checks: int = 40) -> Reachability:
    for _ in range(checks):
        service._next_ask.clear()
        await service.check_once()
    return service.status


async def test_fresh_peers_however_many_cannot_flip_the_verdict():
    host = Host()
    answers: dict[ID, bool] = {}
    honest = host.add("8.8.1.1", age=0.0)  # our bootstrap peer: we can be dialled
    answers[honest] = True
    service, asked = service_with_answers(host, answers, bootstrap={honest})
    assert await settle(service) is Reachability.public
    # Twenty fresh identities, each from its own /16, all saying "private".
    fakes = [host.add(f"{20 + i}.1.0.1", age=1.0) for i in range(20)]
    answers.update({fake: False for fake in fakes})
    assert await settle(service) is Reachability.public
    assert not any(fake in asked for fake in fakes)  # not even asked: too young to count


async def test_many_established_peers_from_one_network_are_one_voice():
    host = Host()
    answers: dict[ID, bool] = {}
    honest = [host.add(f"{30 + i}.0.0.1", age=3600.0) for i in range(2)]  # two networks: public
    answers.update({peer: True for peer in honest})
    service, _ = service_with_answers(host, answers)
    assert await settle(service) is Reachability.public
    # Twenty old identities in one /16 (one rented subnet), all saying "private": one voice, outvoted.
    fakes = [host.add(f"66.6.{i}.1", age=3600.0) for i in range(20)]
    answers.update({fake: False for fake in fakes})
    assert await settle(service) is Reachability.public
    assert len(service._verdicts) == 3


async def test_established_peers_from_distinct_networks_do_flip_it():
    host = Host()
    answers: dict[ID, bool] = {}
    first = host.add("8.8.1.1", age=3600.0)
    answers[first] = True
    service, _ = service_with_answers(host, answers)
    assert await settle(service) is Reachability.public
    # Our NAT changed, say: three peers that have been with us a while, from three networks, can
    # no longer dial us. With the first one's stale "public", three of four say private.
    others = [host.add(f"{40 + i}.2.0.1", age=MIN_SERVER_AGE_SECONDS + 1) for i in range(3)]
    answers.update({peer: False for peer in others})
    assert await settle(service) is Reachability.private


async def test_on_loopback_every_peer_is_one_local_voice():
    # As in the tests and on one machine: every peer is "local", so the status is the latest
    # local verdict (one bootstrap peer decides at once, as before).
    host = Host()
    bootstrap = host.add("127.0.0.1", age=0.0)
    service, _ = service_with_answers(host, {bootstrap: True}, bootstrap={bootstrap})
    assert await settle(service, checks=2) is Reachability.public
    assert list(service._verdicts) == ["local"]


async def test_a_real_fresh_connection_is_too_young_until_it_has_stayed(monkeypatch):
    # The age comes from py-libp2p 0.8.1's own connection (SwarmConn._created_at).
    from tests.support.hosts import two_connected_hosts

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            server, client = await two_connected_hosts(nursery)
            service = ReachabilityService(
                client,
                mode="auto",
                interval=60,
                gate=PeerGate(),
                on_change=lambda status: None,
            )
            assert service.established_servers() == {}
            monkeypatch.setattr(time, "time", lambda real=time.time: real() + MIN_SERVER_AGE_SECONDS)
            assert service.established_servers() == {server.get_id(): "local"}
            nursery.cancel_scope.cancel()
