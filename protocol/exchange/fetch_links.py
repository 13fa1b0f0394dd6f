"""The links a fetch opens (group_fetch.py): one bounded try of an author's addresses, and at
most `linger` of the links it opened kept open, the least recently used closed first.

An author's record may name eight addresses, every one of them dead; trying each in turn took
10 s for the direct ones and 15 s for each relay (issue #41). So an author gets its direct
addresses, then one relayed address, all within the caller's deadline. Relayed links are closed
like direct ones: the dialer's `hang_up` keeps both ends from dialling them back
(protocol/reach/relayed_links.py), so relay-only authors take turns at the places.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any, Protocol

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from sapo.protocol.toolkit.hosts import open_peers, relay_of
from sapo.training.bounded import BoundedMap

# The direct try's share of an author's deadline when a relayed address waits behind it (a
# NATed node's own address does not answer at all).
DIRECT_DIAL_SECONDS = 2.0


class Links(Protocol):
    """What the fetcher needs of the network's dialer (protocol/reach/dialing.py)."""

    async def dial(self, info: PeerInfo) -> bool:
        """One bounded dial, unless the gate refuses the peer: whether it is connected after."""
        ...

    def keeps(self, peer: ID) -> bool:
        """A link that is not a fetch's to close (bootstrap peers, relays we hold a slot on)."""
        ...

    async def hang_up(self, peer: ID) -> None:
        """Close our links to `peer` on purpose: neither end dials a relayed one again."""
        ...


class FetchLinks:
    """Dials authors through `links` and keeps at most `linger` of the links it opened (`most`
    in all while a pass has more in use)."""

    def __init__(self, host: Any, links: Links, count: Callable[..., None], *, linger: int, most: int) -> None:
        self.host = host
        self.links = links
        self.count = count
        self.linger = linger
        self._opened: BoundedMap[ID, None] = BoundedMap(most)  # least recently used first

    async def dial(self, peer: ID, addrs: tuple[multiaddr.Multiaddr, ...]) -> bool:
        """Its direct addresses, then one relayed address (through a relay we are connected to, if
        it names one); the direct try for at most DIRECT_DIAL_SECONDS when a relay waits behind it."""
        direct = [a for a in addrs if not is_relayed_addr(a)]
        via = one_relayed_addr(addrs, set(open_peers(self.host)))
        if direct:
            with trio.move_on_after(DIRECT_DIAL_SECONDS if via is not None else math.inf):
                if await self.links.dial(PeerInfo(peer, direct)):
                    return True
        return via is not None and await self.links.dial(PeerInfo(peer, [via]))

    async def opened(self, peer: ID) -> None:
        """We dialled `peer`: its link is ours to close, unless the dialer keeps it."""
        if self.links.keeps(peer):
            return
        evicted = self._opened.put(peer, None)
        if evicted is not None:  # only with more links in use at once than `most`
            await self.links.hang_up(evicted[0])

    def used(self, peer: ID) -> None:
        self._opened.touch(peer)

    async def close_spare(self) -> None:
        """Past `linger` links, close the least recently used (a closed one frees its place)."""
        connected = set(open_peers(self.host))
        for peer in [p for p in self._opened if p not in connected]:
            self._opened.pop(peer)
        spare = []
        while len(self._opened) > self.linger:
            peer, _ = self._opened.pop_oldest()
            if not self.links.keeps(peer):  # it may have become a relay we reserve on
                spare.append(peer)
        self.count("fetch_links_closed", len(spare))
        async with trio.open_nursery() as nursery:
            for peer in spare:
                nursery.start_soon(self.links.hang_up, peer)


def is_relayed_addr(address: multiaddr.Multiaddr) -> bool:
    return "/p2p-circuit" in str(address)


def one_relayed_addr(addrs: tuple[multiaddr.Multiaddr, ...], connected: set[ID]) -> multiaddr.Multiaddr | None:
    """One of `addrs`' relayed addresses: through a relay we are connected to if there is one
    (no new connection to a relay, and a relay that is there), else any, at random."""
    relayed = [a for a in addrs if is_relayed_addr(a)]
    through_ours = [a for a in relayed if relay_of(a) in connected]
    return random.choice(through_ours or relayed) if relayed else None
