"""Bootstrap addresses: the shapes `peers` accepts, and a /dns4 name resolved by the OS resolver.

Only `localhost` is resolved here (from /etc/hosts, no DNS query leaves the machine); names
that need a DNS server, /dnsaddr and failures are tests/hardening/test_dns_bootstrap.py, inside
network namespaces with their own resolver."""

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from pydantic import ValidationError

from sapo.protocol.reach.addresses import AddressError, parse_peer_address, resolve_peer_address
from sapo.protocol.settings import NetworkSettings
from tests.support.gossip import start_node

PEER = ID.from_pubkey(create_new_key_pair(b"\x11" * 32).public_key)


@pytest.mark.parametrize(
    "address, kind",
    [
        (f"/ip4/10.0.0.5/tcp/4001/p2p/{PEER}", "ip"),
        (f"/ip6/::1/tcp/4001/p2p/{PEER}", "ip"),
        (f"/dns4/bootstrap.example.org/tcp/4001/p2p/{PEER}", "name"),
        (f"/dns6/bootstrap.example.org/tcp/4001/p2p/{PEER}", "name"),
        (f"/dns/bootstrap.example.org/tcp/4001/p2p/{PEER}", "name"),
        ("/dnsaddr/bootstrap.example.org", "dnsaddr"),
        (f"/dnsaddr/bootstrap.example.org/p2p/{PEER}", "dnsaddr"),
    ],
)
def test_accepted_shapes(address, kind):
    parsed = parse_peer_address(address)
    assert parsed.kind == kind
    assert parsed.peer_id == (None if address == "/dnsaddr/bootstrap.example.org" else PEER)
    assert NetworkSettings(peers=[address]).peers == [address]


@pytest.mark.parametrize(
    "address, problem",
    [
        ("/ip4/10.0.0.5/tcp/4001", "is not /ip4|ip6|dns|dns4|dns6"),  # no peer id
        (f"/ip4/10.0.0.5/udp/4001/quic-v1/p2p/{PEER}", "is not /ip4|ip6|dns|dns4|dns6"),
        (f"/dnsaddr/example.org/tcp/4001/p2p/{PEER}", "a /dnsaddr takes only"),
        ("bootstrap:4001", "is not a multiaddr"),
        ("/ip4/10.0.0.5/tcp/4001/p2p/not-a-peer-id", "is not a multiaddr"),
    ],
)
def test_refused_shapes_say_what_would_work(address, problem):
    with pytest.raises(AddressError, match=problem):
        parse_peer_address(address)
    with pytest.raises(ValidationError, match="/dns4/bootstrap.example.org"):
        NetworkSettings(peers=[address])


async def test_a_dns4_name_resolves_through_the_hosts_file():
    (info,) = await resolve_peer_address(f"/dns4/localhost/tcp/4001/p2p/{PEER}", timeout=5)
    assert info.peer_id == PEER and [str(a) for a in info.addrs] == ["/ip4/127.0.0.1/tcp/4001"]


async def test_a_node_bootstraps_from_a_dns4_name():
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            hub = await start_node(nursery)
            port, peer = hub.addr.split("/tcp/")[1].split("/p2p/")
            leaf = await start_node(nursery, peers=[f"/dns4/localhost/tcp/{port}/p2p/{peer}"])
            with trio.fail_after(10):
                while leaf.service.connected_peers() != [hub.service.peer_id]:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
