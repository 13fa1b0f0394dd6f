"""The one way this project makes a libp2p host (TCP, Noise only, yamux), and who it is connected to.

A default py-libp2p host also offers TLS, secio and /plaintext/2.0.0, and accepts a
plaintext-only dialler; gossip and the judge both go through here so neither can.

Its dials are never retried inside libp2p (`RetryConfig(max_retries=0)`): the gossip keeper
and the judge client own their back-off, and 0.8.1's three internal retries tripled every dead
peer's cost. `new_host` does not pass a retry config on to its swarm, so the host is put
together here from `new_swarm` and `BasicHost`, as `new_host` does.

Nothing dials on its own either. 0.8.1's swarm runs an AutoConnector that keeps dialling every
peer in the peerstore until 150 connections are open (every address identify ever told us,
banned and not-allowed peers included, and a NATed peer's private addresses). It overrode
`discover_peers` (a peer told to reach another only through a relay was dialled directly
within seconds) and dials outside the allow list and bans. No setting turns it off (its target
is the midpoint of the watermarks, and a zero high watermark makes the pruner close everything),
so it is replaced by one that does nothing: the bootstrap keeper and discovery decide whom to dial.

Each inbound connection gives its slot back when its link closes (inbound.py): 0.8.1 kept it
until the node stopped, and refused every inbound connection after the 250th of its life. And
connections in their handshake hold at most HANDSHAKING of the slots, so silent ones from one
address cannot hold them all; and one slot in 16 is kept free, by closing what has not proved
itself yet from the most crowded place (`host.inbound_room`).

Its identify answers say `sapo/<version>` (agents.py), so a peer can tell which release we run.

Its own keys are its own: 0.8.1's host reads them from the peerstore, which keeps at most 1,000
peers and evicts those without an address first, the host's own entry among them. Once strangers'
keys (or a large swarm's) had filled it, the next identify request raised inside the swarm and
ended the node (tests/hardening/test_attack3_own_key_evicted.py).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from typing import Any

import multiaddr
import trio
from libp2p import new_swarm
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519
from libp2p.host.basic_host import BasicHost
from libp2p.io.exceptions import ConnectionClosedError
from libp2p.network.auto_connector import AutoConnector
from libp2p.network.config import RetryConfig
from libp2p.network.connection_pruner import get_connection_direction
from libp2p.network.swarm import Swarm
from libp2p.peer.id import ID
from libp2p.peer.peerstore import PeerStoreError
from libp2p.rcmgr import Direction, new_resource_manager
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux

from sapo.protocol.toolkit.agents import IDENTIFY, identify_as
from sapo.protocol.toolkit.inbound import InboundRoom, release_slots_with_links
from sapo.protocol.toolkit.release import agent_string

logger = logging.getLogger("sapo.gossip")


def new_noise_host(
    key_pair: Any,
    listen: list[multiaddr.Multiaddr],
    psk: str | None = None,
    addrs_factory: Callable[[list[multiaddr.Multiaddr]], list[multiaddr.Multiaddr]] | None = None,
) -> Any:
    """A host with Noise as its only security protocol and yamux as its muxer; `psk` (hex)
    turns on libp2p pnet for a private swarm. `addrs_factory` turns the listen (and observed)
    addresses into the ones the host advertises (identify), e.g. adding relayed addresses."""
    resource_manager = new_resource_manager()  # what new_host gives every host
    swarm = new_swarm(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519().private_key)},
        muxer_opt={YAMUX_PROTOCOL_ID: Yamux},  # type: ignore[dict-item]  # 0.8.1 types its muxers by interface
        listen_addrs=listen,
        psk=psk,
        retry_config=RetryConfig(max_retries=0),
        resource_manager=resource_manager,
    )
    assert isinstance(swarm, Swarm)  # what new_swarm builds; typed as its interface
    swarm.auto_connector = _NoAutoConnect(swarm)
    _end_links_on_reset(swarm.upgrader.muxer_multistream)
    room = release_slots_with_links(swarm, network_group)  # 0.8.1 kept each inbound slot until the node stopped
    host = _OwnKeysHost(key_pair, room, network=swarm, resource_manager=resource_manager, addrs_factory=addrs_factory)
    host.set_stream_handler(IDENTIFY, identify_as(host, agent_string()))  # "sapo/<version>", not py-libp2p's
    return host


class _Yamux(Yamux):
    """py-libp2p 0.8.1's yamux, ending its link once a write finds the connection closed.

    Why: its read loop answers a peer's PINGs inline, and takes a write that finds the
    connection reset (`ConnectionClosedError`) for a passing error: it logs it, sleeps 10 ms and
    reads on, answering every PING still buffered. A link stuffed with PINGs whose peer then left
    spent 100-130 s and about 8,000 logged errors that way, its inbound slot held throughout
    (h-atk5's finding 4). A reset connection stays reset: marked as shutting down, the loop's
    error path closes the link at once (tests/hardening/test_attack5_zombie_links.py).

    0.8.1 builds every yamux link as `Yamux(...)` by name (muxer_multistream.py `new_conn`),
    whatever class `muxer_opt` names, so `_end_links_on_reset` puts this class on each one: it
    adds behaviour only, no state."""

    async def _write_frame(self, data: bytes) -> None:
        try:
            await super()._write_frame(data)
        except ConnectionClosedError:
            self.event_shutting_down.set()
            raise


def _end_links_on_reset(multistream: Any) -> None:
    """Make every yamux link `multistream` (0.8.1's MuxerMultistream) builds a `_Yamux`."""
    library_new_conn = multistream.new_conn

    async def new_conn(conn: Any, peer_id: ID) -> Any:
        muxed = await library_new_conn(conn, peer_id)
        if type(muxed) is Yamux:
            muxed.__class__ = _Yamux
        return muxed

    multistream.new_conn = new_conn


class _OwnKeysHost(BasicHost):
    """A BasicHost that answers its own keys from the key pair it was made with, not from the
    peerstore, which may have evicted them (see the module docstring)."""

    def __init__(self, key_pair: Any, inbound_room: InboundRoom, **kwargs: Any) -> None:
        self._key_pair = key_pair  # BasicHost's own __init__ asks for the keys already
        self.inbound_room = inbound_room  # what holds its inbound slots (the connection manager reads it)
        super().__init__(**kwargs)

    def get_public_key(self) -> Any:
        return self._key_pair.public_key

    def get_private_key(self) -> Any:
        return self._key_pair.private_key


class _NoAutoConnect(AutoConnector):
    """The swarm's auto-connector, minus the dialling (see the module docstring)."""

    async def maybe_connect(self) -> None:
        return


def open_peers(host: Any) -> list[ID]:
    """Peers with an open connection. The host's own list keeps a closed connection for a while
    (until the swarm's cleanup task runs, which a busy node may not get to for seconds)."""
    network = host.get_network()
    return [
        peer
        for peer in host.get_connected_peers()
        if any(not connection.is_closed for connection in network.get_connections(peer))
    ]


def dialled_peers(host: Any) -> list[ID]:
    """Peers we opened a connection to ourselves that is still open: the links no stranger
    chose, which a node keeps enough of (discovery's `target`) so that strangers who connect to
    it cannot be all it has (Bitcoin Core's outbound connections)."""
    network = host.get_network()
    return [
        peer
        for peer in open_peers(host)
        if any(
            not c.is_closed and get_connection_direction(c) == Direction.OUTBOUND for c in network.get_connections(peer)
        )
    ]


def is_relayed(connection: Any) -> bool:
    """Whether a connection runs through a relay (a /p2p-circuit address), not straight to the peer."""
    try:
        return any("/p2p-circuit" in str(address) for address in connection.get_transport_addresses())
    except Exception:  # noqa: BLE001 - a connection being torn down
        return False


def relay_of(address: Any) -> ID | None:
    """The relay a `/p2p-circuit` address goes through (`[<ip/tcp>]/p2p/<relay>/p2p-circuit[/p2p/<peer>]`)."""
    text = str(address)
    head = text.split("/p2p-circuit")[0]
    if "/p2p-circuit" not in text or "/p2p/" not in head:
        return None
    try:
        return ID.from_base58(head.rsplit("/p2p/", 1)[1])
    except Exception:  # noqa: BLE001 - not a peer id
        return None


def circuit_relay(connection: Any) -> ID | None:
    """The relay a relayed connection runs through, as its address names it, else None."""
    try:
        addresses = connection.get_transport_addresses()
    except Exception:  # noqa: BLE001 - a connection being torn down
        return None
    return next((relay for relay in map(relay_of, addresses) if relay is not None), None)


def direct_peers(host: Any) -> list[ID]:
    """Peers with an open connection that is not relayed (the only ones whose view of our
    address means anything, and the only ones that can relay for us)."""
    network = host.get_network()
    return [
        peer
        for peer in host.get_connected_peers()
        if any(not c.is_closed and not is_relayed(c) for c in network.get_connections(peer))
    ]


def speaks(host: Any, peer: ID, protocol: str) -> bool:
    """Whether `peer`'s identify listed `protocol` (the peerstore keeps it after the peer leaves)."""
    try:
        return protocol in host.get_peerstore().get_protocols(peer)
    except Exception:  # noqa: BLE001 - a peer never identified
        return False


def connection_addresses(host: Any) -> dict[str, list[str]]:
    """The transport address of each open connection, per connected peer (base58)."""
    network = host.get_network()
    found: dict[str, list[str]] = {}
    for peer in open_peers(host):
        addresses = []
        for connection in network.get_connections(peer):
            if connection.is_closed:
                continue
            try:
                addresses += [str(a) for a in connection.get_transport_addresses()]
            except Exception:  # noqa: BLE001 - a connection closing under us
                continue
        found[peer.to_base58()] = sorted(set(addresses))
    return found


def connection_age(connection: Any, now: float) -> float:
    """Seconds since `connection` was made: py-libp2p 0.8.1's SwarmConn notes when (wall clock);
    no other record exists."""
    return now - getattr(connection, "_created_at", now)


def connected_seconds(host: Any, peer: ID) -> float:
    """How long our oldest open connection to `peer` has lasted (0 if none)."""
    now = time.time()
    ages = [connection_age(c, now) for c in host.get_network().get_connections(peer) if not c.is_closed]
    return max(ages, default=0.0)


def direct_ip(host: Any, peer: ID) -> str | None:
    """The IP of `peer`'s open direct connection; None if it has none (not connected, or only
    through a relay, whose IP is the relay's)."""
    for connection in host.get_network().get_connections(peer):
        if connection.is_closed or is_relayed(connection):
            continue
        try:
            addresses = connection.get_transport_addresses()
        except Exception:  # noqa: BLE001 - a connection closing under us
            continue
        for address in addresses:
            for protocol in ("ip4", "ip6"):
                try:
                    return address.value_for_protocol(protocol)
                except Exception:  # noqa: BLE001 - multiaddr raises when the protocol is absent
                    continue
    return None


def network_group(ip: str) -> str:
    """The network a peer's IP belongs to, for counting it once with its neighbours' (a
    reachability verdict, a place among a server's requests, standing's budget):
    the IPv4 /16 or the IPv6 /32 (Bitcoin Core's buckets: one operator rarely holds addresses in
    many of them), or "local" for any address that is not globally routable (loopback, RFC 1918
    and ULA, link-local, carrier-grade NAT, documentation ranges). Such a peer shares our host, LAN,
    VPN or container network: nothing tells its addresses apart as operators, and its dial-back
    only proves the local path, so all of them together are one voice (as Bitcoin Core puts every
    unroutable address in one group). On one machine or in one test network every peer is local."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return "local"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if not address.is_global:
        return "local"
    prefix = 16 if address.version == 4 else 32
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))


def peer_place(host: Any, peer: str) -> str | None:
    """Where `peer`'s connection comes from, for counting its keys with their neighbours'
    (standing's budgets): its direct connection's network group; for a peer we reach only through
    a relay, "via " and the relay's network group (or its id, if its IP is not known), so keys
    behind one relay count as one place apart from the relay's own neighbours; None if not
    connected."""
    try:
        peer_id = ID.from_base58(peer)
    except Exception:  # noqa: BLE001 - gossip only hands out ids libp2p decoded
        return None
    ip = direct_ip(host, peer_id)
    if ip is not None:
        return network_group(ip)
    for connection in host.get_network().get_connections(peer_id):
        relay = None if connection.is_closed else circuit_relay(connection)
        if relay is not None:
            relay_ip = direct_ip(host, relay)
            return f"via {network_group(relay_ip) if relay_ip is not None else relay.to_base58()}"
    return None


def known_addrs(host: Any, peer: ID) -> list[multiaddr.Multiaddr]:
    """The addresses the peerstore holds for `peer`, or none. py-libp2p 0.8.1's `addrs` raises
    `PeerStoreError` for a peer it has never heard of and for one whose addresses' TTL ran out."""
    try:
        return list(host.get_peerstore().addrs(peer))
    except PeerStoreError:
        return []


def replace_addrs(host: Any, peer: ID, addrs: list[multiaddr.Multiaddr], ttl: int) -> None:
    """Make `addrs` the only addresses the peerstore holds for `peer`. 0.8.1's `clear_addrs`
    raises `PeerStoreError` when the peer's addresses expired while its signed peer record is
    held (it asks `addrs`, which raises on expiry, to decide whether to drop the record): the
    addresses are cleared by then, so that is not an error here. Uncaught, it ended a node's
    fetcher, and with it the node, the first time it dialled an author last seen over an hour
    before (bench/wild.py, 64 nodes with churn)."""
    peerstore = host.get_peerstore()
    try:
        peerstore.clear_addrs(peer)
    except PeerStoreError:
        pass
    peerstore.add_addrs(peer, addrs, ttl)


def reached_group(ip: str | None) -> str:
    """The network group a connection from `ip` counts in: `network_group(ip)`, or one "relayed"
    group for a connection through a relay, which has no IP of its own (the IP seen is the relay's)."""
    return network_group(ip) if ip is not None else "relayed"


def address_scope(ip: str | None) -> str:
    """How far from us an address can be: "loopback" (this machine), "private" (not globally
    routable: RFC 1918, ULA fc00::/7, link-local, carrier-grade NAT 100.64/10, documentation
    ranges), or "public". An IP we do not know (a relayed connection's) is "public": a stranger
    beyond our host and LAN."""
    try:
        address = ipaddress.ip_address(ip) if ip is not None else None
    except ValueError:
        address = None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address is None or address.is_global:
        return "public"
    return "loopback" if address.is_loopback else "private"


def peer_str(peer_id_bytes: bytes) -> str:
    """A raw peer id as base58, or as hex if it is not one (a malformed frame's `from`)."""
    try:
        return ID(peer_id_bytes).to_base58()
    except Exception:  # noqa: BLE001 - any bytes may arrive here
        return peer_id_bytes.hex()


async def cut_connections(host: Any, peer_id: ID) -> None:
    """Drop every connection to `peer_id` now, whatever its peer does; callers bound it in time.

    Why not `host.disconnect` alone: 0.8.1 marks the connection closed first, then yamux's polite
    close takes its stream lock and writes a GO_AWAY. A peer that does not read (it stopped, or
    it filled our send buffer with answers to its PINGs on purpose) makes that write wait for
    ever, and a caller's time bound then cancels the close half-way: the link stays open
    underneath, its inbound slot held (inbound.py waits for the muxer to close), registered in
    the swarm for the node's life (0.8.1's max_connections counts it), and no longer seen by the
    connection manager (tests/hardening/test_attack5_zombie_links.py). A peer flooding us held
    the polite close off for seconds the same way. Closing the secured connection underneath
    ends the TCP stream at once and wakes a write that waits on it; the polite close then runs to
    its end and tidies up."""
    for connection in host.get_network().get_connections(peer_id):
        try:
            await connection.muxed_conn.secured_conn.close()
        except Exception as error:  # noqa: BLE001 - already closed, or another transport
            logger.debug("cutting the connection to %s failed: %s", peer_id, error)
    try:
        await host.disconnect(peer_id)
    except Exception as error:  # noqa: BLE001 - it may be gone already
        logger.debug("closing connection to %s failed: %s", peer_id, error)


async def reset_stream(stream: Any) -> None:
    """Reset a stream we refuse, within a second, whatever state the peer left it in."""
    with trio.move_on_after(1.0):
        try:
            await stream.reset()
        except Exception:  # noqa: BLE001 - already gone is fine
            pass


async def close_stream(stream: Any) -> None:
    """Close a stream we are done with; a peer that reset it first is no error."""
    try:
        await stream.close()
    except Exception:  # noqa: BLE001 - already gone is fine
        pass
