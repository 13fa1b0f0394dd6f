"""Relayed links that end are recovered: the peer is dialled again, the relay slot taken again.

A circuit always ends some time. A relay resets it at its limits (a common implementation's
default is 128 KiB or two minutes; ours announces 256 MiB or an hour), and it goes when the
relay goes. Nothing in py-libp2p 0.8.1 dials a circuit again, and our discovery dials only
while the node is short of peers, and only peers that speak `/sapo/peers/1`: a standard libp2p
peer that reached a NATed node through a relay was lost at the relay's first cut.

So `RelayedLinks` watches the host's connections (a libp2p network notifee) and:

- when a relayed connection closes and its peer has no other connection, dials that peer again
  through a relay (the one that carried it, or any other it is known at; discovery's record
  first), least-cutting relay first, with back-off (0.5 s doubling to 30 s, at most 8 tries).
  Both ends notice the cut; the end that dialled the lost circuit dials again at once, the end
  that accepted it only if the link is still down a few seconds later and its peer is not a node
  of this release (a standard libp2p peer never dials again; a node of ours dials back what it
  dialled, unless it closed the link on purpose), so that two nodes of ours open one new
  circuit, not two;
- a link we closed on purpose (a fetch done with an author, group_fetch.py, through the dialer's
  `hang_up`) is not dialled again, so a node can close the relayed links it opened, as it closes
  its direct ones, without both ends bringing them back;
- when the direct connection to a relay we hold a slot on closes, wakes the reservation keeper
  (relay.py), which reserves on another relay if there is one, and on this one again once the
  bootstrap keeper or discovery has dialled it back;
- `RelayCuts`: a circuit that ended within `EARLY_CIRCUIT_SECONDS`, while its relay stayed
  connected to us and its peer could be reached again, counts against that relay for half an
  hour. Relays are tried in order of fewest such cuts when reserving and when dialling, so a
  relay that keeps cutting circuits early is used last.

Counts: `relayed_links_lost`, `relayed_redials`, `relayed_links_recovered`,
`relayed_redial_gave_up`, `relayed_links_let_go` (closed on purpose, or left to the end that
dialled it), and on the relay's side `relay_circuits_limited` (relay_guards.py).
"""

from __future__ import annotations

import logging
import random
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import multiaddr
import trio
from libp2p.abc import INotifee
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.rcmgr import Direction

from sapo.protocol.toolkit.hosts import circuit_relay, direct_peers, is_relayed, known_addrs
from sapo.protocol.toolkit.peer_gate import PeerGate

logger = logging.getLogger("sapo.relay")

REDIAL_BACKOFF_INITIAL_SECONDS = 0.5
REDIAL_BACKOFF_MAX_SECONDS = 30.0
REDIAL_ATTEMPTS = 8
# The end that accepted the lost circuit lets the one that dialled it redial first (one new
# circuit, not two; a circuit dial takes 0.1-2 s here).
ACCEPTOR_WAIT_SECONDS = 3.0
# A circuit that lived less than this was cut early (ours last an hour; a 128 KiB one, seconds).
EARLY_CIRCUIT_SECONDS = 600.0
CUT_MEMORY_SECONDS = 1800.0
# Closed connections waiting to be looked at; a flood past this is dropped (each is one link).
PENDING_CLOSES = 256


class RelayCuts:
    """When each relay cut circuits early; `order` puts the relays that cut least first."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, memory: float = CUT_MEMORY_SECONDS) -> None:
        self.clock = clock
        self.memory = memory
        self._cuts: dict[ID, list[float]] = {}

    def record(self, relay: ID) -> None:
        now = self.clock()
        recent = [t for t in self._cuts.get(relay, []) if now - t < self.memory]
        self._cuts[relay] = [*recent, now]
        if len(self._cuts) > 1024:  # forget relays with nothing recent
            self._cuts = {r: ts for r, ts in self._cuts.items() if ts and now - ts[-1] < self.memory}

    def count(self, relay: ID) -> int:
        now = self.clock()
        return sum(1 for t in self._cuts.get(relay, []) if now - t < self.memory)

    def order(self, relays: list[ID]) -> list[ID]:
        """Fewest recent cuts first; among equals, the order given."""
        return sorted(relays, key=self.count)


@dataclass(frozen=True)
class RelaySlots:
    """What relayed links need of the relay service (relay.py), and no more."""

    holds: Callable[[ID], bool]  # whether we hold a reservation on this relay
    lost: Callable[[ID], None]  # our reservation on this relay went with its connection
    relay_address: Callable[[ID], multiaddr.Multiaddr | None]  # our direct address of a relay
    cuts: RelayCuts  # relays that cut circuits early, tried last


@dataclass(frozen=True)
class ClosedLink:
    peer: ID
    relayed: bool
    relay: ID | None  # the relay that carried it, if the address names it
    lived: float  # seconds
    dialled: bool  # we opened it (else the peer did)


class _ForwardCloses(INotifee):
    """A network notifee that only notes when connections open and hands closed ones on
    (libp2p awaits notifees inline: they must not block)."""

    def __init__(self, send: trio.MemorySendChannel[ClosedLink], my_id: ID, clock: Callable[[], float]) -> None:
        self.send = send
        self.my_id = my_id
        self.clock = clock
        self.opened: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    async def connected(self, network: Any, conn: Any) -> None:
        self.opened[conn] = self.clock()

    async def disconnected(self, network: Any, conn: Any) -> None:
        try:
            peer = conn.muxed_conn.peer_id
        except Exception:  # noqa: BLE001
            return
        relayed = is_relayed(conn)
        relay = circuit_relay(conn) if relayed else None
        if relay == self.my_id:
            relay = None  # an accepted circuit whose relay 0.8.1 did not name (relay_guards.py)
        dialled = getattr(conn, "direction", None) == Direction.OUTBOUND
        link = ClosedLink(peer, relayed, relay, self.clock() - self.opened.get(conn, self.clock()), dialled)
        try:
            self.send.send_nowait(link)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    async def opened_stream(self, network: Any, stream: Any) -> None:
        return

    async def closed_stream(self, network: Any, stream: Any) -> None:
        return

    async def listen(self, network: Any, multiaddr: Any) -> None:
        return

    async def listen_close(self, network: Any, multiaddr: Any) -> None:
        return


class Dials(Protocol):
    """What relayed links need of the network's dialer (dialing.py): one bounded dial, the gate's
    refusals checked there, and whether we hung up on a peer on purpose."""

    async def dial(self, info: PeerInfo) -> bool: ...

    def hung_up(self, peer: ID) -> bool: ...


class RelayedLinks:
    """Recovers relayed links that end (see the module docstring); `run()` it in the network's
    nursery (network.py). The `gate` says whom not to dial again (protocol/toolkit/peer_gate.py) and counts;
    `known_addrs(peer)` is what discovery's record of it says; `dials_back(peer)`, whether the peer
    is a node that dials its own lost links again (one of this release), so that a link it
    dialled is left to it."""

    def __init__(
        self,
        host: Any,
        relay: RelaySlots,
        *,
        dialer: Dials,
        gate: PeerGate,
        known_addrs: Callable[[ID], list[multiaddr.Multiaddr]],
        dials_back: Callable[[ID], bool] = lambda peer: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.relay = relay
        self.dialer = dialer
        self.known_addrs = known_addrs
        self.dials_back = dials_back
        self.gate = gate
        self.count = gate.count
        self.clock = clock
        self.my_id: ID = host.get_id()
        self._redialling: set[ID] = set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        send, receive = trio.open_memory_channel[ClosedLink](PENDING_CLOSES)
        network = self.host.get_network()
        notifee = _ForwardCloses(send, self.my_id, self.clock)
        network.register_notifee(notifee)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                async for link in receive:
                    self._closed(link, nursery)
        finally:
            network.remove_notifee(notifee)

    def _closed(self, link: ClosedLink, nursery: trio.Nursery) -> None:
        network = self.host.get_network()
        if any(not c.is_closed for c in network.get_connections(link.peer)):
            return  # another connection to it is open (e.g. hole-punched): nothing was lost
        if not link.relayed:
            if self.relay.holds(link.peer):
                self.relay.lost(link.peer)  # our relay slot there is gone with it
            return
        if self.dialer.hung_up(link.peer) or (not link.dialled and self.dials_back(link.peer)):
            # we closed it on purpose; or its peer, which opened it, brings it back if it wants
            # it (and closed it itself if it did not): nothing here to recover
            self.count("relayed_links_let_go")
            return
        self.count("relayed_links_lost")
        if link.peer not in self._redialling and self.gate.may_use(link.peer):
            self._redialling.add(link.peer)
            nursery.start_soon(self._redial, link)

    async def _redial(self, link: ClosedLink) -> None:
        peer = link.peer
        relay_stayed = link.relay in direct_peers(self.host)
        try:
            if not link.dialled:
                await trio.sleep(ACCEPTOR_WAIT_SECONDS)
            delay = REDIAL_BACKOFF_INITIAL_SECONDS
            for attempt in range(REDIAL_ATTEMPTS):
                if self._connected(peer):
                    break  # the other end, or discovery, dialled it
                if not self.gate.may_use(peer):
                    return
                if attempt:
                    await trio.sleep(delay * random.uniform(0.75, 1.25))
                    delay = min(delay * 2, REDIAL_BACKOFF_MAX_SECONDS)
                    if self._connected(peer):
                        break
                self.count("relayed_redials")
                if await self.dialer.dial(PeerInfo(peer, self._addresses(peer, link.relay))):
                    self.count("relayed_links_recovered")
                    logger.info("dialled %s again after its relayed link closed (it lived %.0f s)", peer, link.lived)
                    break
            else:
                self.count("relayed_redial_gave_up")
                logger.info("could not reach %s again after its relayed link closed; discovery may find it later", peer)
                return
            if relay_stayed and link.lived < EARLY_CIRCUIT_SECONDS and link.relay is not None:
                self.relay.cuts.record(link.relay)  # the peer was there all along: the relay cut it
        finally:
            self._redialling.discard(peer)

    def _connected(self, peer: ID) -> bool:
        return any(not c.is_closed for c in self.host.get_network().get_connections(peer))

    def _addresses(self, peer: ID, via: ID | None) -> list[multiaddr.Multiaddr]:
        """Where to reach `peer` again: its discovery record, else only its relayed addresses
        (a NATed peer's own would cost a dial timeout), and a circuit through the relay that
        carried the lost link, if we are still connected to it."""
        found = list(self.known_addrs(peer))
        if not found:
            found = [a for a in known_addrs(self.host, peer) if "/p2p-circuit" in str(a)]
        relay_address = self.relay.relay_address(via) if via is not None else None
        if relay_address is not None:
            found.append(multiaddr.Multiaddr(f"{relay_address}/p2p/{via}/p2p-circuit"))
        return list(dict.fromkeys(found))
