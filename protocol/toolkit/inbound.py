"""An inbound connection gives its slot back when its link closes, not when the node stops.

Why: py-libp2p 0.8.1's swarm admits inbound connections through a limiter of
`max_connections - min_connections` slots (300 - 50 = 250), and the task that holds a slot then
waits for the *swarm* to finish (`_do_handle_inbound_connection`: `manager.wait_finished()`), not
for its connection to close. (The task must outlive its link, since trio's `serve_listeners`
closes a stream when its handler returns; 0.8.1 makes it outlive every link.) So every inbound
connection a node ever accepted kept its slot, and from the 250th on the node closed each new one
at once, before a byte was read, for the rest of its life. A node's fetchers' links are inbound at
the authors they draw, so a busy node got there in minutes: in the wild bench (issue #41) all
three seeds refused every newcomer from about 17 minutes into the run, and a node left alone for
a month would have served only the peers already connected to it.

How: the node's swarm handles a TCP connection as 0.8.1 does (its connection gate, then the
security and muxer upgrade, which register the link), waits for that link's muxer to close, and
returns, so the slot comes back with the link. The limiter stays as 0.8.1 means it: at most 250
inbound links open at once. A pre-multiplexed transport (QUIC) goes to 0.8.1's own handler; the
node listens on TCP only.

A slot is taken before a byte is read, and a connection that never finishes its handshake keeps
it for `inbound_upgrade_timeout` (10 s): 250 silent TCP connections from one address, about 25
connects a second and no key, kept every newcomer out (tests/hardening/
test_attack5_stalled_handshakes.py; 0.8.1 had the same hole). So at most HANDSHAKING connections
are in their handshake at once, and a new one past that closes the oldest of the place (IPv4
/16, IPv6 /32, or the address itself on our host and LAN) that has the most in handshake: an
honest handshake takes milliseconds, and an address that keeps opening connections only closes
its own.

And the slots that stay are not all a stranger's to take: links younger than the connection
manager's grace are not counted against its watermarks (a newcomer must have time to prove
useful), so a stranger with addresses in about 20 /16s, remaking 8 links from each before they
are counted, could hold every slot that handshakes and counted links leave (h-atk5's finding 3).
So a link that finishes its handshake while fewer than one slot in ROOM_SHARE is free (15 of
250) closes one that has not proved itself yet, as Bitcoin Core's inbound eviction does: from
the place with the most handshakes and young links together (between places holding as many,
the one whose latest arrival is the most recent), its oldest handshake, or else its youngest link
(tests/hardening/test_attack5_young_links_from_many_groups.py). The connection manager names the
young links (`InboundRoom.young_links`); an honest swarm, whose links last, never gets there.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import trio
from libp2p.abc import IMuxedConn
from libp2p.network.connection.exceptions import RawConnError
from libp2p.network.connection.raw_connection import RawConnection

logger = logging.getLogger("sapo.gossip")

# Inbound connections in their security and muxer handshake at once (of the library's 250 slots).
HANDSHAKING = 64
# One inbound slot in this many is kept free for whoever comes next (15 of the library's 250):
# fewer free when a connection arrives, and one connection that has not proved itself is closed.
ROOM_SHARE = 16


class Handshake(NamedTuple):
    """An inbound connection in its handshake: the place it comes from, and when it began."""

    place: str
    began: float  # time.monotonic()


@dataclass(frozen=True)
class YoungLink:
    """A link the connection manager does not count yet, as it names one to the room."""

    place: str  # `place_of` its peer's address
    lasted: float  # seconds
    peer: Any  # its peer's id
    close: Callable[[], Awaitable[object]]  # bounded


def place_of(ip: str, group_of: Callable[[str], str]) -> str:
    """Where an inbound connection comes from: its network group, or on our host and LAN (where
    every address is in the one "local" group) the address itself."""
    group = group_of(ip)
    return ip if group == "local" else group


class InboundRoom:
    """The inbound slots that can be taken back: connections in their handshake, oldest first, each
    with the place it comes from; and the young links the connection manager names
    (`young_links`, none until it runs)."""

    def __init__(
        self, group_of: Callable[[str], str], slots: Callable[[], trio.CapacityLimiter], most: int = HANDSHAKING
    ) -> None:
        self.group_of = group_of
        self.slots = slots  # the library's limiter of inbound slots (tests cut it to a few)
        self.most = most
        self.pending: dict[Any, Handshake] = {}
        self.young_links: Callable[[], list[YoungLink]] = list

    def place(self, stream: Any) -> str:
        try:
            ip = stream.get_remote_address()[0]
        except Exception:  # noqa: BLE001 - no address: one place for all such
            return "unknown"
        return place_of(ip, self.group_of)

    async def admit(self, raw: Any, place: str) -> None:
        """Count `raw` in; past `most` handshakes, close the oldest handshake of the place with the
        most."""
        self.pending[raw] = Handshake(place, time.monotonic())
        if len(self.pending) > self.most:
            crowd = Counter(handshake.place for handshake in self.pending.values())
            most = max(crowd.values())
            oldest = next(other for other, handshake in self.pending.items() if crowd[handshake.place] == most)
            await self._close_handshake(oldest)

    async def arrived(self, peer: Any) -> None:
        """A link from `peer` finished its handshake: with fewer than one slot in ROOM_SHARE free,
        close one that has not proved itself (`make_room`). Only after the handshake, so that room
        costs the arriving side a key and a Noise handshake, not a bare TCP connect (h-atk6)."""
        if self.short_of_slots():
            await self.make_room(arrived=peer)

    def short_of_slots(self) -> bool:
        slots = self.slots()
        return slots.available_tokens < max(1, int(slots.total_tokens) // ROOM_SHARE)

    async def make_room(self, arrived: Any = None) -> None:
        """Close the oldest handshake, or else the youngest young link, of the place that holds the
        most of both together, and between places holding as many, the one whose latest arrival is
        the most recent (Bitcoin Core's rule, as the trim's): a stranger that spreads its links one
        or two a place and keeps remaking them ties with honest newcomers, whose links have waited
        longer; taking the tied place of the *oldest* arrival closed every one of them (h-atk6).
        Never the link of the peer that `arrived` itself: it came to a node with room for it;
        nothing, if nothing else has yet to prove itself."""
        young = [link for link in self.young_links() if link.peer != arrived]
        now = time.monotonic()
        crowd = Counter(handshake.place for handshake in self.pending.values()) + Counter(link.place for link in young)
        if not crowd:
            return
        latest: dict[str, float] = {}  # seconds since each place's latest arrival
        for pending in self.pending.values():
            latest[pending.place] = min(latest.get(pending.place, float("inf")), now - pending.began)
        for link in young:
            latest[link.place] = min(latest.get(link.place, float("inf")), link.lasted)
        place = max(crowd, key=lambda where: (crowd[where], -latest[where]))
        oldest = next((raw for raw, pending in self.pending.items() if pending.place == place), None)
        if oldest is not None:
            await self._close_handshake(oldest)
            return
        youngest = min((link for link in young if link.place == place), key=lambda link: link.lasted)
        logger.debug("closing a young link from %s: %d slots free", place, self.slots().available_tokens)
        await youngest.close()

    async def _close_handshake(self, raw: Any) -> None:
        place = self.pending.pop(raw).place
        logger.debug("closing a handshake from %s: %d in handshake", place, len(self.pending) + 1)
        await _close_quietly(raw)  # its upgrade fails and gives its slot back

    def done(self, raw: Any) -> None:
        self.pending.pop(raw, None)


def release_slots_with_links(swarm: Any, group_of: Callable[[str], str]) -> InboundRoom:
    """Make `swarm` (0.8.1's Swarm) end each inbound connection's task when its link closes, with
    at most HANDSHAKING of them in their handshake and one slot in ROOM_SHARE kept free; `group_of(ip)` is the
    network group of an address ("local" for our host and LAN). The room it returns is the node's
    one record of them (the connection manager names its young links to it)."""
    room = InboundRoom(group_of, lambda: swarm._inbound_limiter)
    swarm._do_handle_inbound_connection = partial(
        _handle_until_closed, swarm, room, swarm._do_handle_inbound_connection
    )
    return room


async def _handle_until_closed(
    swarm: Any, room: InboundRoom, library_handler: Any, stream: Any, maddr: Any, failure_event: Any
) -> None:
    if isinstance(stream, IMuxedConn):  # QUIC, WebTransport: not a transport of ours
        await library_handler(stream, maddr, failure_event)
        return
    remote = swarm._build_remote_multiaddr(stream)
    if remote is not None and not await swarm.connection_gate.is_allowed(remote):
        await _close_quietly(stream)
        return
    raw = HandshakeConnection(stream, False)
    await room.admit(raw, room.place(stream))
    try:
        muxed = await swarm.upgrade_inbound_raw_conn(raw, maddr)
    except Exception as error:  # noqa: BLE001 - a stranger's failed handshake is routine, as in 0.8.1
        logger.debug("inbound connection from %s failed: %s", remote, error)
        await _close_quietly(raw)
        return
    finally:
        room.done(raw)
        raw.handshaking = False
    await room.arrived(muxed.peer_id)
    # the link is registered; this task (and its slot) lasts exactly as long as the link does
    await muxed.event_closed.wait()


class HandshakeConnection(RawConnection):
    """0.8.1's raw connection, except that in its handshake a read at the end of the stream fails
    at once. Why: 0.8.1 reads a closed stream as b"" (io/trio.py, for a local close too) and
    `read_exactly` tries 100 more reads before it gives up, so each connection the room closed, or
    that a stranger opened and closed, cost the node about 100 reads: under load it finished its
    handshake seconds after its close, held its slot all that time, and silent connections from one
    address held all 250 slots again (test_attack5_stalled_handshakes.py on a busy machine). After
    the handshake the link reads as 0.8.1's does."""

    handshaking = True

    async def read(self, n: int | None = None) -> bytes:
        data = await super().read(n)
        if not data and n != 0 and self.handshaking:
            raise RawConnError("the connection ended in its handshake")
        return data


async def _close_quietly(closer: Any) -> None:
    try:
        await closer.close()
    except Exception:  # noqa: BLE001 - already closed by the peer is fine
        pass


__all__ = [
    "HANDSHAKING",
    "ROOM_SHARE",
    "HandshakeConnection",
    "InboundRoom",
    "YoungLink",
    "place_of",
    "release_slots_with_links",
]
