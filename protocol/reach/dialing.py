"""Dialling peers: one bounded dial (directly, else through a relay), and the keeper that holds
one `--peers` entry connected for as long as the node runs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from sapo.protocol.reach.addresses import AddressError, resolve_peer_address
from sapo.protocol.settings import NetworkSettings
from sapo.protocol.toolkit.hosts import cut_connections, replace_addrs
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.training.bounded import BoundedMap

if TYPE_CHECKING:
    from sapo.protocol.reach.relay import RelayService

logger = logging.getLogger("sapo.gossip")

# Poll interval of the bootstrap keeper while a peer is connected (a dropped connection is
# noticed within this time; py-libp2p has no per-peer "disconnected" event we can await).
CONNECTION_CHECK_SECONDS = 0.5
# Bound on one dial attempt (TCP connect + Noise + yamux + multistream).
DIAL_TIMEOUT_SECONDS = 10.0
# Bound on resolving one DNS bootstrap address (OS resolver, or a /dnsaddr TXT lookup).
DNS_TIMEOUT_SECONDS = 10.0
# Peers we hung up on and have not dialled since, remembered so that no one dials them back.
MAX_HUNG_UP = 1024
# A polite close of a link we are done with; a peer that does not take it is left to time out.
HANG_UP_SECONDS = 1.0


def is_connected(network: Any, peer_id: ID) -> bool:
    return any(not connection.is_closed for connection in network.get_connections(peer_id))


async def dial(host: Any, info: PeerInfo, relay: RelayService | None) -> BaseException | None:
    """One bounded dial, directly or else through a relay; None once connected."""
    direct = [a for a in info.addrs if "/p2p-circuit" not in str(a)]
    relayed = [a for a in info.addrs if "/p2p-circuit" in str(a)]
    error: BaseException | None = ConnectionError(f"no address to dial {info.peer_id} at")
    if direct:
        error = await dial_direct(host, PeerInfo(info.peer_id, direct))
    if error is not None and relayed and relay is not None:
        error = await relay.dial(PeerInfo(info.peer_id, relayed))
        if error is None and not is_connected(host.get_network(), info.peer_id):
            error = ConnectionError("relayed dial returned without a connection")
    return error


async def dial_direct(host: Any, info: PeerInfo) -> BaseException | None:
    """One bounded direct dial; None once connected, else what went wrong."""
    network = host.get_network()
    # A peer that restarted on a new port stays unreachable while its old address sits
    # in the peerstore (dial_peer tries one address per transport), and a failed dial
    # blocks every redial for 60 s. The address we were given is authoritative: reset both.
    replace_addrs(host, info.peer_id, info.addrs, 3600)
    if hasattr(network, "unblock_peer"):
        network.unblock_peer(info.peer_id)
    error: BaseException | None = None
    with trio.move_on_after(DIAL_TIMEOUT_SECONDS) as scope:
        try:
            await host.connect(info)
        except Exception as dial_error:
            error = dial_error
    if scope.cancelled_caught:
        error = TimeoutError(f"dial timed out after {DIAL_TIMEOUT_SECONDS:.0f} s")
    if error is None and not is_connected(network, info.peer_id):
        error = ConnectionError("dial returned without a connection")
    return error


class Dialer:
    """The network's one way to dial a peer it chose (discovery, fetching, relayed links): one
    bounded dial (directly, else through a relay), never of a peer the gate refuses, and one per
    peer at a time (discovery and the relayed-link keeper may want the same peer at once, and two
    circuits to one peer are one too many: a second caller waits for the first dial and shares
    its outcome). It also knows which links a fetch must not close (`keeps`), and closes the others
    for it (`hang_up`), remembering them so that relayed_links.py does not dial them again
    (`hung_up`, until we dial the peer ourselves)."""

    def __init__(self, host: Any, relay: RelayService, gate: PeerGate, bootstrap_ids: set[ID]) -> None:
        self.host = host
        self.relay = relay
        self.gate = gate
        self.bootstrap_ids = bootstrap_ids  # filled by the bootstrap keeper as it resolves `peers`
        self._pending: dict[ID, trio.Event] = {}
        self._hung_up: BoundedMap[ID, None] = BoundedMap(MAX_HUNG_UP)

    async def dial(self, info: PeerInfo) -> bool:
        """Whether `info.peer_id` is connected after one bounded dial (False if the gate refuses it)."""
        if self.gate.refusal(info.peer_id) is not None:
            return False
        self._hung_up.pop(info.peer_id)  # wanted again: a link that ends now is worth recovering
        pending = self._pending.get(info.peer_id)
        if pending is not None:
            await pending.wait()
            return is_connected(self.host.get_network(), info.peer_id)
        done = self._pending[info.peer_id] = trio.Event()
        try:
            error = await dial(self.host, info, self.relay)
        finally:
            del self._pending[info.peer_id]
            done.set()
        if error is not None:
            logger.debug("dial of discovered peer %s failed: %s", info.peer_id, error)
        return error is None

    def keeps(self, peer: ID) -> bool:
        """A link a fetch must not close: to a bootstrap peer, or a relay we hold a slot on."""
        return peer in self.bootstrap_ids or peer in self.relay.reservations

    async def hang_up(self, peer: ID) -> None:
        """Close every connection to `peer`, on purpose: a relayed one is not dialled again
        (relayed_links.py asks `hung_up`; the peer's end leaves a link it did not dial to us)."""
        self._hung_up.put(peer, None)
        with trio.move_on_after(HANG_UP_SECONDS):
            await cut_connections(self.host, peer)  # not the polite close: see cut_connections

    def hung_up(self, peer: ID) -> bool:
        """Whether we closed our links to `peer` on purpose and have not dialled it since."""
        return peer in self._hung_up


class BootstrapKeeper:
    """Keeps `--peers` entries connected until the node has joined; the network (network.py)
    owns the host and its gate decides whom it refuses (allow list, bans). `joined()` says the
    node knows enough other peers: a seed lost after that (a seed trims its links,
    connections.py) is not dialled again, unless the node falls short again."""

    def __init__(
        self,
        host: Any,
        settings: NetworkSettings,
        gate: PeerGate,
        relay: RelayService | None,
        bootstrap_ids: set[ID],
        joined: Callable[[], bool] = lambda: False,
    ) -> None:
        self.host = host
        self.settings = settings
        self.my_id = host.get_id()
        self.refusal = gate.refusal
        self.relay = relay
        self.count = gate.count
        self.bootstrap_ids = bootstrap_ids  # shared with the relay: the relays a NATed node tries first
        self.joined = joined

    async def keep(self, address: str) -> None:
        """Keep one `peers` entry connected: resolve it (a name may point elsewhere after a
        restart), dial each peer it names with exponential back-off, redial whenever one drops."""
        host, settings = self.host, self.settings
        delay = settings.dial_backoff_initial
        infos: list[PeerInfo] = []
        connected: set[ID] = set()
        while True:
            network = host.get_network()
            usable = [i for i in infos if i.peer_id != self.my_id and self.refusal(i.peer_id) is None]
            now = {i.peer_id for i in usable if is_connected(network, i.peer_id)}
            for peer in now - connected:
                logger.info("connected to bootstrap peer %s (%s)", peer, address)
            for peer in connected - now:
                logger.info("lost bootstrap peer %s (%s)%s", peer, address, "" if self.joined() else "; redialling")
            connected = now
            if usable and (len(now) == len(usable) or self.joined()):
                delay = settings.dial_backoff_initial
                await trio.sleep(CONNECTION_CHECK_SECONDS)
                continue
            if infos and not usable:  # banned: do not dial it back in; look again later
                await trio.sleep(CONNECTION_CHECK_SECONDS)
                continue
            try:
                infos = await resolve_peer_address(address, DNS_TIMEOUT_SECONDS)
            except AddressError as error:
                self.count("dns_failed")
                logger.info("bootstrap peer %s: %s; retrying in %.1f s", address, error, delay)
                await trio.sleep(delay)
                delay = min(delay * 2, settings.dial_backoff_max)
                continue
            if all(i.peer_id == self.my_id for i in infos):
                logger.info("bootstrap address %s is this node; skipping", address)
                return
            self.bootstrap_ids.update(i.peer_id for i in infos if i.peer_id != self.my_id)
            missing = [
                i
                for i in infos
                if i.peer_id != self.my_id and self.refusal(i.peer_id) is None and not is_connected(network, i.peer_id)
            ]
            errors: list[BaseException] = []

            async def dial_one(info: PeerInfo) -> None:
                error = await dial(host, info, self.relay)
                if error is not None:
                    errors.append(error)

            async with trio.open_nursery() as dials:
                for info in missing:
                    dials.start_soon(dial_one, info)
            if not errors:
                continue
            self.count("dial_failed", len(errors))
            logger.debug("dial %s failed (%s); retrying in %.1f s", address, errors[0], delay)
            await trio.sleep(delay)
            delay = min(delay * 2, settings.dial_backoff_max)
