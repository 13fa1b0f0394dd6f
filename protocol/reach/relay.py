"""NAT traversal for the gossip host: Circuit Relay v2 and hole punching (DCUtR), py-libp2p 0.8.1's.

A node that reachability.py finds `private` reserves a slot on up to `relays_to_reserve`
relay-serving peers it is directly connected to (its bootstrap peers first) and advertises
`<relay address>/p2p/<relay>/p2p-circuit` in its signed peer record and in identify. A peer that
learns that record dials the circuit: the relay opens a STOP stream to us and pipes the bytes
(Noise runs end to end, so the relay sees ciphertext). Both ends then run DCUtR on the relayed
connection: they swap their observed addresses and dial each other at the same moment from
their listen port, which opens a direct TCP connection through most NATs (cone NATs that drop
unsolicited SYNs rather than answer them with a reset). DCUtR closes the relayed connection
60 s after the direct one is up; GossipSub moves to the direct one, since it reopens its stream
on any connection left.

A node serves as a relay (`relay`: "on"; "auto", the default, once it finds itself `public`,
so public bootstrap nodes relay without being told) within limits: reservations, circuits per
reserved peer, bytes and seconds per circuit, and one budget for the whole relay (circuits open
at once, bytes a second, bytes an hour: relay_guards.RelayBudget), since it relays in Python on
the cores that train. Peers that the network refuses (allow
list, bans) can neither reserve, nor open a circuit, nor be the target of one, and circuits
from them are refused on arrival.

What is 0.8.1's and what is ours: the wire protocols, the relay's resource accounting, the
circuit transport and DCUtR are the library's. Ours: when to reserve and on whom (0.8.1's
RelayDiscovery reserves on every relay it meets and its transport reserves again on every
dial), the advertised addresses, the refusals above, the fixes in relay_guards.py, and what
happens when a relayed link or a relay slot ends (relayed_links.py: dial again, reserve again,
and use relays that cut circuits early last).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.rcmgr import Direction
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.tools.anyio_service import background_trio_service

from sapo.protocol.reach.reachability import Reachability
from sapo.protocol.reach.relay_guards import GuardedRelayProtocol, ProtectedCircuits, RelayBudget
from sapo.protocol.reach.relayed_links import RelayCuts, RelaySlots
from sapo.protocol.toolkit.hosts import direct_peers, is_relayed, known_addrs, relay_of
from sapo.protocol.toolkit.peer_gate import PeerGate

logger = logging.getLogger("sapo.relay")

# A reservation is valid this long on the relay and renewed at half of it; a peer that left
# frees its slot within this time (0.8.1's default, an hour, let departed peers hold slots).
RESERVATION_TTL_SECONDS = 300
# Reservation upkeep: how often to look while short of reservations, and otherwise.
RESERVE_RETRY_SECONDS = 2.0
RESERVE_CHECK_SECONDS = 15.0
# One reservation or one circuit dial (relay connect + HOP + STOP + Noise over the circuit).
RESERVE_TIMEOUT_SECONDS = 10.0
CIRCUIT_DIAL_TIMEOUT_SECONDS = 15.0
# A peer that refused to reserve for us is asked again only after this long; a bootstrap peer
# sooner: a public bootstrap serves only once it has found itself public, which takes
# reachability.MIN_SERVER_AGE_SECONDS after its first peers came, and they are those who ask it.
RESERVE_REFUSED_BACKOFF_SECONDS = 60.0
BOOTSTRAP_REFUSED_BACKOFF_SECONDS = 10.0


@dataclass
class Reservation:
    relay: ID
    address: multiaddr.Multiaddr  # the relay's /ip4|ip6/<ip>/tcp/<port>, as we reach it
    expires: float  # monotonic

    @property
    def circuit(self) -> multiaddr.Multiaddr:
        return multiaddr.Multiaddr(f"{self.address}/p2p/{self.relay}/p2p-circuit")


class Reservations(dict[ID, Reservation]):
    """The relay slots we hold, by relay. Built before the host, whose identify answers list our
    addresses through them (`with_relayed`), and kept by the relay service (which needs the host)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock

    def relayed_addrs(self) -> list[multiaddr.Multiaddr]:
        """Our addresses through the relays we hold a slot on (without /p2p/<us>)."""
        now = self.clock()
        return [r.circuit for r in self.values() if r.expires > now]

    def with_relayed(self, addrs: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
        """`addrs` and our relayed addresses: what the host's identify answers advertise."""
        return [*addrs, *self.relayed_addrs()]


def circuit_parts(address: multiaddr.Multiaddr) -> tuple[multiaddr.Multiaddr, ID] | None:
    """(relay's /ip*/tcp address, relay id) of `<relay>/p2p/<relay id>/p2p-circuit[/p2p/<peer>]`."""
    relay = relay_of(address)
    if relay is None:
        return None
    try:
        return multiaddr.Multiaddr(str(address).split("/p2p-circuit")[0].rsplit("/p2p/", 1)[0]), relay
    except Exception:  # noqa: BLE001 - no transport address before the relay's id
        return None


class RelayService:
    """Relay for others when we should, reserve on relays when we must, dial circuits, punch holes.

    The network (network.py) owns the host and passes in its `gate` (protocol/toolkit/peer_gate.py: whom we may
    relay for, reserve on and dial through, and the counters), the relays to try first, and the
    `reservations` the host's identify answers read (its own, by default)."""

    def __init__(
        self,
        host: Any,
        *,
        relay: str,
        limits: RelayLimits,
        relays_to_reserve: int,
        hole_punching: bool,
        gate: PeerGate,
        preferred_relays: Callable[[], list[ID]],
        reservations: Reservations | None = None,
        budget: RelayBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.relay = relay
        self.relays_to_reserve = relays_to_reserve
        self.hole_punching = hole_punching
        self.preferred_relays = preferred_relays
        self.may_use = gate.may_use
        self.count = gate.count
        self.clock = clock
        self.protocol = GuardedRelayProtocol(host, limits=limits, allow_hop=False, gate=gate, budget=budget)
        # STOP only: we accept circuits; reservations are made here, not on every dial.
        self.transport = ProtectedCircuits(host, self.protocol, RelayConfig(roles=RelayRole.STOP, limits=limits))
        self.reachability = Reachability.unknown
        self.reservations = reservations if reservations is not None else Reservations(clock)
        self.cuts = RelayCuts(clock)  # relays that cut circuits early are tried last
        self._refused_until: dict[ID, float] = {}
        self._wake = trio.Event()
        self._started = False

    @property
    def serving(self) -> bool:
        return self.protocol.allow_hop

    def holds_slot(self, peer: ID) -> bool:
        """Whether `peer` holds a relay slot on us (we relay for it: its link must stay)."""
        return self.serving and self.protocol.resource_manager.has_reservation(peer)

    def set_reachability(self, status: Reachability) -> None:
        self.reachability = status
        self._set_serving(self.relay == "on" or (self.relay == "auto" and status is Reachability.public))
        self._wake.set()

    def _set_serving(self, serving: bool) -> None:
        if serving == self.protocol.allow_hop:
            return
        self.protocol.allow_hop = serving
        if not self._started:
            return  # the protocol's run() registers the hop handler itself
        if serving:
            self.host.set_stream_handler(HOP_PROTOCOL_ID, self.protocol._handle_hop_stream)
        else:
            self.host.remove_stream_handler(HOP_PROTOCOL_ID)
        logger.info("relay service %s", "on: serving circuits for other peers" if serving else "off")

    def lost(self, relay: ID) -> None:
        """Our connection to `relay` closed: look for another slot now, not at the next check."""
        if relay in self.reservations:
            logger.info("lost the connection to relay %s; reserving again", relay)
            self._wake.set()

    def slots(self) -> RelaySlots:
        """What relayed links (relayed_links.py) may see of this service."""
        return RelaySlots(
            holds=self.reservations.__contains__, lost=self.lost, relay_address=self.relay_address, cuts=self.cuts
        )

    def relayed_addrs(self) -> list[multiaddr.Multiaddr]:
        """Our addresses through the relays we hold a slot on (without /p2p/<us>)."""
        return self.reservations.relayed_addrs()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._set_serving(self.relay == "on")
        async with background_trio_service(self.protocol):
            self._started = True
            try:
                if self.hole_punching:
                    async with background_trio_service(DCUtRProtocol(self.host)):
                        task_status.started()
                        await self._keep_reservations()
                else:
                    task_status.started()
                    await self._keep_reservations()
            finally:
                self._started = False

    async def _keep_reservations(self) -> None:
        while True:
            self._prune()
            wanted = self.relays_to_reserve if self.reachability is Reachability.private else 0
            if wanted == 0:
                self.reservations.clear()
            if wanted:
                await self._reserve_more(wanted)
                await self._renew()
            self._wake = trio.Event()
            short = wanted and len(self.reservations) < wanted
            with trio.move_on_after(RESERVE_RETRY_SECONDS if short else RESERVE_CHECK_SECONDS):
                await self._wake.wait()

    def _prune(self) -> bool:
        connected = set(direct_peers(self.host))
        now = self.clock()
        gone = [
            relay
            for relay, r in self.reservations.items()
            if relay not in connected or r.expires <= now or not self.may_use(relay)
        ]
        for relay in gone:
            logger.info("lost the relay slot on %s", relay)
            del self.reservations[relay]
        # A node that runs for months meets many relays: forget the refusals that have run out.
        self._refused_until = {relay: until for relay, until in self._refused_until.items() if until > now}
        return bool(gone)

    async def _reserve_more(self, wanted: int) -> bool:
        now = self.clock()
        connected = direct_peers(self.host)
        preferred = [p for p in self.preferred_relays() if p in connected]
        store = self.host.get_peerstore()

        def advertises_hop(peer: ID) -> bool:
            try:
                return HOP_PROTOCOL_ID in store.get_protocols(peer)
            except Exception:  # noqa: BLE001 - not identified yet
                return False

        candidates = self.cuts.order(preferred + [p for p in connected if p not in preferred and advertises_hop(p)])
        changed = False
        for relay in candidates:
            if len(self.reservations) >= wanted:
                break
            if relay in self.reservations or self._refused_until.get(relay, 0) > now or not self.may_use(relay):
                continue
            address = self.relay_address(relay)
            if address is None:
                continue
            expires = await self._reserve(relay)
            if expires is None:
                backoff = BOOTSTRAP_REFUSED_BACKOFF_SECONDS if relay in preferred else RESERVE_REFUSED_BACKOFF_SECONDS
                self._refused_until[relay] = self.clock() + backoff
                continue
            self.reservations[relay] = Reservation(relay, address, expires)
            self.count("relay_reserved")
            logger.info(
                "reserved a relay slot on %s: reachable at %s/p2p/%s",
                relay,
                self.reservations[relay].circuit,
                self.host.get_id(),
            )
            changed = True
        return changed

    async def _renew(self) -> bool:
        now = self.clock()
        for relay, reservation in list(self.reservations.items()):
            if reservation.expires - now < RESERVATION_TTL_SECONDS / 2:
                expires = await self._reserve(relay)
                if expires is None:
                    del self.reservations[relay]
                    return True
                reservation.expires = expires
        return False

    async def _reserve(self, relay: ID) -> float | None:
        """One RESERVE on its own stream; the local expiry time, or None if refused or failed."""
        stream = None
        with trio.move_on_after(RESERVE_TIMEOUT_SECONDS):
            try:
                stream = await self.host.new_stream(relay, [HOP_PROTOCOL_ID])
                if await self.transport._make_reservation(stream, relay):
                    ttl = self.transport._reservations.get(relay, 0) - time.time()
                    return self.clock() + max(1.0, min(ttl, RESERVATION_TTL_SECONDS))
            except Exception as error:  # noqa: BLE001 - no relay protocol there, reset, closed
                logger.debug("reservation on %s failed: %s", relay, error)
            finally:
                if stream is not None:
                    with trio.move_on_after(1.0):
                        try:
                            await stream.close()
                        except Exception:  # noqa: BLE001
                            pass
        return None

    def relay_address(self, relay: ID) -> multiaddr.Multiaddr | None:
        """Where others reach the relay: the address of our outbound connection to it, else a
        specific /ip*/tcp address it is known by."""
        for connection in self.host.get_network().get_connections(relay):
            if is_relayed(connection) or getattr(connection, "direction", None) != Direction.OUTBOUND:
                continue
            for address in connection.get_transport_addresses():
                if _is_ip_tcp(address):
                    return _ip_tcp_part(address)
        for address in known_addrs(self.host, relay):
            if _is_ip_tcp(address):
                return _ip_tcp_part(address)
        return None

    async def dial(self, info: PeerInfo) -> BaseException | None:
        """Connect to `info.peer_id` through one of its /p2p-circuit addresses; None once
        connected, else what went wrong. The relay must pass `may_use` too."""
        error: BaseException | None = ConnectionError(f"no usable relayed address for {info.peer_id}")

        # In random order (every dialler taking the first one would pile all circuits on one
        # relay), relays that cut circuits early last.
        def cuts_of(address: multiaddr.Multiaddr) -> int:
            relay = relay_of(address)
            return self.cuts.count(relay) if relay is not None else 0

        for address in sorted(random.sample(list(info.addrs), len(info.addrs)), key=cuts_of):
            parts = circuit_parts(address)
            if parts is None:
                continue
            relay_address, relay = parts
            if relay == self.host.get_id() or not self.may_use(relay):
                continue
            full = multiaddr.Multiaddr(f"{relay_address}/p2p/{relay}/p2p-circuit/p2p/{info.peer_id}")
            with trio.move_on_after(CIRCUIT_DIAL_TIMEOUT_SECONDS) as scope:
                try:
                    await self.transport.dial(full)
                    self.count("relay_dials")
                    return None
                except Exception as dial_error:  # noqa: BLE001 - relay gone, no reservation, refused
                    error = dial_error
            if scope.cancelled_caught:
                error = TimeoutError(f"circuit dial via {relay} timed out")
        self.count("relay_dial_failed")
        return error


def _is_ip_tcp(address: multiaddr.Multiaddr) -> bool:
    try:
        names = [p.name for p in address.protocols()]
        if names[:2] not in (["ip4", "tcp"], ["ip6", "tcp"]):
            return False
        ip = address.value_for_protocol(names[0])
    except Exception:  # noqa: BLE001
        return False
    return ip not in ("0.0.0.0", "::")


def _ip_tcp_part(address: multiaddr.Multiaddr) -> multiaddr.Multiaddr:
    """/ip4|ip6/<ip>/tcp/<port> alone (a protected connection's address also names the peer)."""
    names = [p.name for p in address.protocols()]
    return multiaddr.Multiaddr(
        f"/{names[0]}/{address.value_for_protocol(names[0])}/tcp/{address.value_for_protocol('tcp')}"
    )


def relay_limits(*, reservations: int, circuits_per_peer: int, circuit_bytes: int, circuit_seconds: int) -> RelayLimits:
    return RelayLimits(
        duration=circuit_seconds,
        data=circuit_bytes,
        max_circuit_conns=circuits_per_peer,
        max_reservations=reservations,
        reservation_ttl=RESERVATION_TTL_SECONDS,
    )
