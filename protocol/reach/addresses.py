"""Bootstrap peer addresses: which multiaddrs `peers` accepts, and turning them into dialable ones.

Accepted (each names its peer, except a /dnsaddr, whose TXT records do):
    /ip4/<ip>/tcp/<port>/p2p/<id>          /ip6/<ip>/tcp/<port>/p2p/<id>
    /dns4/<name>/tcp/<port>/p2p/<id>       /dns6/<name>/... and /dns/<name>/... (either family)
    /dnsaddr/<name>[/p2p/<id>]             TXT records `dnsaddr=<multiaddr>` at _dnsaddr.<name>

/dns4, /dns6 and /dns names go through the operating system's resolver (getaddrinfo in a
worker thread), so /etc/hosts, Docker's embedded DNS and `ip netns exec`'s per-namespace
hosts file all work, as `getent` did in the old container entrypoint. py-libp2p 0.8.1's own
resolver (multiaddr's DNSResolver, used by its TCP transport and BootstrapDiscovery) asks DNS
servers directly with dnspython and never reads /etc/hosts: a hosts-file name does not resolve
there (tests/hardening/test_dns_bootstrap.py shows both). A /dnsaddr needs TXT records, which
only a DNS query gives, so that one goes through multiaddr's DNSResolver; the addresses it
yields are checked like any other.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from multiaddr.resolvers import DNSResolver

from sapo.protocol.settings import NAME_PROTOCOLS, AddressError, peer_address_shape  # noqa: F401 - AddressError for callers

# A /dnsaddr may list a whole bootstrap fleet; more than this many peers (or addresses per
# peer) is not a bootstrap list but an attempt to make us dial the world.
MAX_PEERS_PER_DNSADDR = 16
MAX_ADDRS_PER_PEER = 8


@dataclass(frozen=True)
class PeerAddress:
    """One `peers` entry, parsed: its form, and the peer id it names (None for a bare /dnsaddr)."""

    text: str
    kind: str  # "ip", "name" (/dns, /dns4, /dns6) or "dnsaddr"
    peer_id: ID | None


def parse_peer_address(text: str) -> PeerAddress:
    """The entry if it has one of the accepted shapes (settings.peer_address_shape), else
    AddressError naming the problem."""
    kind, peer = peer_address_shape(text)
    return PeerAddress(text, kind, ID.from_base58(peer) if peer is not None else None)


async def resolve_peer_address(text: str, timeout: float) -> list[PeerInfo]:
    """Dialable PeerInfos (/ip4|ip6/<ip>/tcp/<port>) for one `peers` entry, or AddressError.
    Bounded by `timeout`; a name that does not resolve (yet) is an AddressError too."""
    parsed = parse_peer_address(text)
    address = multiaddr.Multiaddr(text)
    if parsed.kind == "dnsaddr":
        with trio.move_on_after(timeout) as scope:
            return await _resolve_dnsaddr(address, parsed.peer_id, text)
    else:
        assert parsed.peer_id is not None, "the shape check requires a peer id of an ip or a name entry"
        if parsed.kind == "ip":
            return [PeerInfo(parsed.peer_id, [_without_p2p(address)])]
        with trio.move_on_after(timeout) as scope:
            return [PeerInfo(parsed.peer_id, await _resolve_name(address, text))]
    assert scope.cancelled_caught
    raise AddressError(f"resolving {text!r} took longer than {timeout:g} s")


async def _resolve_name(address: multiaddr.Multiaddr, text: str) -> list[multiaddr.Multiaddr]:
    protocol = address.protocols()[0].name
    name, port = address.value_for_protocol(protocol), int(address.value_for_protocol("tcp"))
    try:
        # trio runs getaddrinfo in a worker thread: the OS resolver (hosts file, nsswitch, DNS).
        found = await trio.socket.getaddrinfo(name, port, NAME_PROTOCOLS[protocol], socket.SOCK_STREAM)
    except OSError as error:
        raise AddressError(f"cannot resolve {name!r} in {text!r}: {error}") from None
    addrs: list[multiaddr.Multiaddr] = []
    for family, _, _, _, sockaddr in found:
        ip = ipaddress.ip_address(sockaddr[0])
        dialable = multiaddr.Multiaddr(f"/ip{ip.version}/{ip}/tcp/{port}")
        if family in (socket.AF_INET, socket.AF_INET6) and dialable not in addrs:
            addrs.append(dialable)
    if not addrs:
        raise AddressError(f"{name!r} in {text!r} resolved to no IP address")
    return addrs[:MAX_ADDRS_PER_PEER]


async def _resolve_dnsaddr(address: multiaddr.Multiaddr, peer_id: ID | None, text: str) -> list[PeerInfo]:
    try:
        # The library filters TXT entries by the /p2p/ id when there is one, and recurses.
        found = await DNSResolver().resolve(address)
    except Exception as error:  # noqa: BLE001 - ResolutionError, dns exceptions
        raise AddressError(f"cannot resolve {text!r}: {error}") from None
    by_peer: dict[ID, list[multiaddr.Multiaddr]] = {}
    for entry in found:
        try:
            parsed = parse_peer_address(str(entry))
        except AddressError:
            continue  # a TXT entry we cannot dial (another transport, no peer id)
        if parsed.kind != "ip" or parsed.peer_id is None or (peer_id is not None and parsed.peer_id != peer_id):
            continue
        if parsed.peer_id not in by_peer and len(by_peer) >= MAX_PEERS_PER_DNSADDR:
            continue
        addrs = by_peer.setdefault(parsed.peer_id, [])
        if len(addrs) < MAX_ADDRS_PER_PEER:
            addrs.append(_without_p2p(entry))
    if not by_peer:
        raise AddressError(f"{text!r} lists no /ip4|ip6/.../tcp/.../p2p/<id> address")
    return [PeerInfo(peer, addrs) for peer, addrs in by_peer.items()]


def _without_p2p(address: multiaddr.Multiaddr) -> multiaddr.Multiaddr:
    text = str(address)
    return multiaddr.Multiaddr(text.split("/p2p/")[0]) if "/p2p/" in text else address
