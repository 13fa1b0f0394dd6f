"""Links between watermarks: a node's connections, seeds' included, do not grow with the swarm.

Why: nothing capped a node's connections, and every node kept its seed links for ever
(`BootstrapKeeper`). At 128 nodes each seed held 127 links; at 10,000 it would hold about
10,000, and, always connected, it was asked for groups far more often than any other author
(issue #41, docs/bench/scale.md).

How (go-libp2p's connection manager, and Bitcoin Core's inbound eviction, in small):
- Every CHECK_SECONDS, a node with more than `high` links that will have lasted GRACE_SECONDS by
  the next check closes them down to `low`, so links past their grace stay at most `high`.
  Younger links (they have not had the chance to be useful) and protected ones are neither
  counted nor closed: a relay we hold a slot on, a peer holding a slot on us
  (bounded by --relay-max-reservations), a relayed link (relayed_links.py would dial it again at
  once), or a bootstrap peer while this node has not joined yet (dialled fewer than `joined`
  other peers). While young and lasted links together are over `high`, young links others
  opened from one network group past YOUNG_PER_GROUP are closed at once, so remaking links
  cannot hold many places either (`crowded_out`).
- Links others opened to us go first, but never the longest-lasting of them, up to half of
  `low`; each one closed is taken from the network group (IPv4 /16, IPv6 /32, or "local") that
  holds the most of the candidates, so that what stays is spread over as many groups as there
  were: a block of addresses that opened many links loses them first.
- The other half is the keeper's: once a node has joined, it no longer dials a seed back
  (dialing.py, `BootstrapKeeper`), so a seed that trimmed its link is not dialled again.

py-libp2p 0.8.1 has a pruner with watermarks (libp2p/network/connection_pruner.py), but it
never closes a connection with an open stream, and every link of ours holds GossipSub's stream
for good, so it would close nothing; it also knows nothing of network groups or of our relays.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio
from libp2p.network.connection_pruner import get_connection_direction
from libp2p.peer.id import ID
from libp2p.rcmgr import Direction

from sapo.protocol.toolkit.hosts import (
    connection_age,
    cut_connections,
    dialled_peers,
    direct_ip,
    is_relayed,
    network_group,
    open_peers,
)
from sapo.protocol.toolkit.inbound import YoungLink, place_of

logger = logging.getLogger("sapo.gossip")

CHECK_SECONDS = 5.0
# A link this young is not counted against the watermarks, and one younger than GRACE_SECONDS -
# CHECK_SECONDS is never closed for them (`counted`): a newcomer's links must have time to prove useful.
GRACE_SECONDS = 30.0
# Links closed at once: a node far over `high` comes down over a few checks, not in one cliff.
MAX_CLOSED_PER_CHECK = 32
# Young links others opened from one network group (IPv4 /16, IPv6 /32) at once while the node is
# over its high watermark; more are closed at the next check. The "local" group (our host, our
# LAN: a local swarm is all of it) has no cap.
YOUNG_PER_GROUP = 8
CLOSE_TIMEOUT_SECONDS = 2.0
# The links others opened to us that have lasted longest, up to this share of `low`, are never
# trimmed (Bitcoin Core protects the longest-connected the same way): a stranger whose links came
# later cannot trim them by making the node's groups all hold as many.
LASTED_KEPT_SHARE = 0.5
# How old a list of young links may be when a link arriving at a full node reads it.
YOUNG_FRESH_SECONDS = 1.0


@dataclass(frozen=True)
class _Link:
    """One peer's open links, as the manager sees them."""

    peer: ID
    ip: str | None  # of its direct link
    theirs: bool  # every link is one the peer opened to us
    age: float  # seconds its youngest link has lasted
    counted: bool  # towards the watermarks (`counted`)


class ConnectionManager:
    """Keeps `host`'s peers at most `high`, trimming to `low`; `protected(peer)` names links it
    must never close (relays, relayed links, and seeds until the node has joined)."""

    def __init__(
        self,
        host: Any,
        *,
        low: int,
        high: int,
        protected: Callable[[ID], bool],
        count: Callable[..., None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0 < low <= high:
            raise ValueError("connection watermarks need 0 < low <= high")
        self.host = host
        self.low = low
        self.high = high
        self.protected = protected
        self.count = count
        self.clock = clock
        self._young: tuple[float, list[YoungLink]] | None = None  # (trio time, list): young_inbound's
        self._closed_since: set[ID] = set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        room = self.host.inbound_room
        room.young_links = self.young_inbound  # a connection arriving at a full node may close one
        task_status.started()
        next_check = trio.current_time()
        try:
            while True:
                # on a fixed beat, however long a trim took (`counted` looks one check ahead), but
                # never a burst of checks to catch up after the loop fell behind
                next_check = max(next_check + CHECK_SECONDS, trio.current_time())
                await trio.sleep_until(next_check)
                await self.trim()
        finally:
            room.young_links = list

    def young_inbound(self) -> list[YoungLink]:
        """The links others opened to us that are not counted yet (`counted`) and not protected,
        each with its place (inbound.py's `place_of`), seconds lasted and a bounded close: what a
        link arriving while the inbound slots run out may close (inbound.py's `make_room`). Walking
        every link costs about 50 µs a peer (12 ms at 245 links, h-atk6), so a list at most
        YOUNG_FRESH_SECONDS old serves, less the peers closed since."""
        now = trio.current_time()
        if self._young is None or now - self._young[0] > YOUNG_FRESH_SECONDS:
            wall = self.clock()
            young = [
                YoungLink(
                    place_of(link.ip, network_group) if link.ip is not None else "unknown",
                    link.age,
                    link.peer,
                    partial(self._close, link.peer),
                )
                for link in self._links(wall)
                if link.theirs and not link.counted
            ]
            self._young = (now, young)
            self._closed_since.clear()
        return [link for link in self._young[1] if link.peer not in self._closed_since]

    async def _close(self, peer: ID) -> bool:
        self._closed_since.add(peer)
        with trio.move_on_after(CLOSE_TIMEOUT_SECONDS):
            await cut_connections(self.host, peer)  # not the polite close: see cut_connections
            return True
        return False

    def _links(self, now: float) -> list[_Link]:
        """Every open peer's direct links that the manager may close (not protected, not relayed),
        as they stand at `now`."""
        found = []
        for peer in open_peers(self.host):
            links = [c for c in self.host.get_network().get_connections(peer) if not c.is_closed]
            if not links or self.protected(peer) or any(is_relayed(c) for c in links):
                continue
            theirs = all(get_connection_direction(c) == Direction.INBOUND for c in links)
            age = min(connection_age(c, now) for c in links)
            found.append(_Link(peer, direct_ip(self.host, peer), theirs, age, counted(links, now)))
        return found

    def surplus(self) -> tuple[list[ID], list[ID]]:
        """The peers to close now: (young links others opened past YOUNG_PER_GROUP from one
        network group, while young and lasted links together are over `high`; and, while more
        than `high` links past their grace are open, enough of those to come down to `low`).
        Links that will not have lasted their grace by the next check (`counted`) and protected
        ones are never counted towards the second: a stranger that keeps remaking links cannot
        push the node over its watermark and make it close the links that have lasted, which are
        the honest ones (an attack on the first version closed every honest link and the seed
        that way)."""
        now = self.clock()
        inbound: list[tuple[ID, str, float]] = []
        outbound: list[tuple[ID, str, float]] = []
        young: dict[str, list[ID]] = {}
        for link in self._links(now):
            group = network_group(link.ip) if link.ip is not None else "unknown"
            if not link.counted:
                if link.theirs:
                    young.setdefault(group, []).append(link.peer)
                continue
            (inbound if link.theirs else outbound).append((link.peer, group, link.age))
        lasted = len(inbound) + len(outbound)
        crowding = crowded_out(young, lasted, self.high)
        if lasted <= self.high:
            return crowding, []
        need = min(lasted - self.low, MAX_CLOSED_PER_CHECK)
        closable = _past_the_longest_lasting(inbound, int(self.low * LASTED_KEPT_SHARE))
        over = _from_the_largest_groups(closable, need) + _from_the_largest_groups(
            outbound, need - min(need, len(closable))
        )
        return crowding, over

    async def trim(self) -> int:
        """Close the surplus; how many peers were closed."""
        closed = 0
        crowding, over = self.surplus()
        if crowding:  # counted apart: honest newcomers from a busy network group are closed too
            self.count("links_young_crowded", len(crowding))

        async def close(peer: ID) -> None:
            nonlocal closed
            done = await self._close(peer)  # not `closed += await ...`: that reads `closed` before it waits
            closed += done

        async with trio.open_nursery() as closing:  # at once: one slow peer must not hold the rest
            for peer in crowding + over:
                closing.start_soon(close, peer)
        if closed:
            self.count("links_trimmed", closed)
            logger.info("closed %d links: over %d connected, down towards %d", closed, self.high, self.low)
        return closed


def crowded_out(young: dict[str, list[ID]], lasted: int, high: int) -> list[ID]:
    """Young links others opened, by network group (oldest first), to close now: those past
    YOUNG_PER_GROUP from one group, and only while young and lasted links together are more than
    `high`. Under it a node has room, and the cap would only close honest newcomers and fetchers
    from a busy /16 (a cloud region's nodes, the wild bench's 16 per /16). Over it the young links a stranger keeps remaking from one group hold at
    most YOUNG_PER_GROUP places. The "local" group is not capped."""
    if lasted + sum(len(peers) for peers in young.values()) <= high:
        return []
    return [peer for group, peers in young.items() if group != "local" for peer in peers[YOUNG_PER_GROUP:]]


def counted(links: list[Any], now: float) -> bool:
    """Whether a peer counts towards the watermarks at a check made `now` (and may be closed to
    come down to `low`): it will have lasted its grace before the next check. Counting only links
    past their grace let up to one check's worth of links pass it uncounted between two checks,
    so a seed taking many links sat over `high` for seconds at a time (the wild bench: 38 lasted
    links against 32); counted a check early, none passes its grace while the node is over."""
    return past_grace(links, now + CHECK_SECONDS)


def past_grace(links: list[Any], now: float) -> bool:
    """Whether every open link to a peer has lasted GRACE_SECONDS (what the wild bench measures;
    the manager counts a check ahead, `counted`)."""
    return min(connection_age(c, now) for c in links) >= GRACE_SECONDS


def must_stay(relay: Any, bootstrap_ids: set[ID], joined: Callable[[], bool], peer: ID) -> bool:
    """A link never trimmed: to a relay we hold a slot on (`relay.reservations`), from a peer that
    holds one on us (`relay.holds_slot`), or to a bootstrap peer while the node has not joined."""
    return peer in relay.reservations or relay.holds_slot(peer) or (peer in bootstrap_ids and not joined())


def has_joined(host: Any, bootstrap_ids: set[ID], target: int) -> bool:
    """Whether a node has dialled `target` peers besides its bootstrap peers, and is connected to
    them: from then on its seeds are peers like any other (trimmed, and not dialled again). Only
    links it opened count: strangers who connect to it cannot make it let its seeds go. Never,
    with discovery off (`target` 0): then the seeds are all it has."""
    return target > 0 and dialled_beside(host, bootstrap_ids) >= target


def dialled_beside(host: Any, bootstrap_ids: set[ID]) -> int:
    """How many peers besides the bootstrap ones we have dialled and are still connected to."""
    return sum(peer not in bootstrap_ids for peer in dialled_peers(host))


def _past_the_longest_lasting(candidates: list[tuple[ID, str, float]], kept: int) -> list[tuple[ID, str, float]]:
    """`candidates` (peer, network group, seconds lasted) less the `kept` that have lasted longest."""
    return sorted(candidates, key=lambda candidate: -candidate[2])[kept:]


def _from_the_largest_groups(candidates: list[tuple[ID, str, float]], need: int) -> list[ID]:
    """`need` of `candidates` (peer, network group, seconds lasted), each taken at random from the
    network group holding the most (between groups holding as many, one at random). Not the
    youngest first: a seed would then keep the nodes that joined long ago and bounce each
    newcomer before it has joined (tests/protocol/test_connections.py), and a stranger that made
    one link in each of many groups before honest peers came would keep them all (h-atk6's
    trim_pinning.py); the longest-lasting links are kept apart instead, up to a share of `low`
    (LASTED_KEPT_SHARE)."""
    pools: dict[str, list[ID]] = {}
    for peer, group, _ in candidates:
        pools.setdefault(group, []).append(peer)
    chosen: list[ID] = []
    while len(chosen) < need and pools:
        largest = max(len(members) for members in pools.values())
        group = random.choice([g for g, members in pools.items() if len(members) == largest])
        members = pools[group]
        chosen.append(members.pop(random.randrange(len(members))))
        if not members:
            del pools[group]
    return chosen


__all__ = ["ConnectionManager", "crowded_out", "dialled_beside", "has_joined", "must_stay"]
