"""Groups are fetched, not flooded: `/sapo/groups/1` (issue #31, docs/bench/scale.md).

Why: on one gossip topic every node receives, decodes and checks every group any node publishes,
6-11 copies of each, while it trains on J a round. A node's cost then grows with the swarm, and
at a few thousand nodes it is more than a laptop's network and cores. Here a node pays for what
it uses: each round it asks for about the groups it will train on, and nothing else arrives.

How:
- `GroupServer` answers a peer's request from our `Outbox` (protocol/wire/group_wire.py): our own newest groups
  after the round the asker names. It answers each peer at most SERVE_BURST times in a row, then
  one a SERVE_INTERVAL, and at most MAX_CONCURRENT_SERVES at once; a peer we refuse (allow list,
  bans) or one over its budget gets its stream reset. Serving costs us a tiny read and a write
  of frames we already hold; asking costs the asker a stream, and a connection if it has none.
- `GroupFetcher.want(count)` asks for `count` groups, GROUPS_PER_AUTHOR from each author it draws.
  Authors are drawn from every peer this node knows, a network group first and then an author in
  it (draw.py), so minting keys buys no more of the draw: its connections and discovery's
  table of signed peer records, which discovery keeps refreshing from random peers, so the draw
  reaches past the neighbours to the whole swarm. Unconnected authors are dialled (through a
  relay if that is what their record says); at most FETCH_LINGER such links stay open, the least
  recently used closed first, relayed ones too (the dialer's `hang_up`: neither end dials them
  back, protocol/reach/relayed_links.py), so relay-only authors take turns. An author answers
  only for itself: Noise authenticated the stream's peer, and the node's intake refuses a group
  whose sender is not that peer. So no one can serve another's group.
- No author can stall it (issue #41): one deadline per author (AUTHOR_SECONDS) for its dial,
  whatever its record names, and its request; a pass counts on an author for HEDGE_SECONDS and
  then draws another beside it, and never waits for its stragglers (fetch_pass.py); an author
  that failed goes to the back of the draw for a while (one a pass, over an open link); and the
  one breaker is our own loop's lag (protocol/toolkit/loop_lag.py), not a remote's silence.
- It owes what the node kept: `refused_fetched(count)` (from the exchange, of groups its intake
  refused) makes them owed again, and the want's few retries ask for them.
- What comes back goes to the node as what it is, an `Arrival` by the fetch route from its
  author (protocol/exchange/arrivals.py), on the channel gossip's messages take, through the same intake
  checks, which charge a bad group to its author as they always have.

A peer that lacks the protocol (a release before 0.4.0) is never asked; the network gossips our
groups on the rollouts topic while one is connected (network.py, `legacy_peers`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import multiaddr
import trio
from libp2p.peer.id import ID

from sapo.protocol.exchange.arrivals import Arrival
from sapo.protocol.exchange.draw import draw_order
from sapo.protocol.exchange.fetch_links import FetchLinks, Links
from sapo.protocol.exchange.fetch_pass import Failures, InFlight
from sapo.protocol.toolkit import streams
from sapo.protocol.toolkit.frames import FrameError
from sapo.protocol.toolkit.hosts import open_peers
from sapo.protocol.toolkit.loop_lag import LoopLag
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.protocol.toolkit.streams import Request, ServeLimits, StreamServer
from sapo.protocol.wire.group_wire import (
    MAX_GROUPS_PER_RESPONSE,
    MAX_REQUEST_BYTES,
    PROTOCOL_ID,
    GroupRequest,
    Outbox,
    ServedGroup,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    response_limit,
)
from sapo.training.bounded import BoundedMap

logger = logging.getLogger("sapo.fetch")

# One request/response, stream open included (the asker's whole author has AUTHOR_SECONDS).
STREAM_TIMEOUT_SECONDS = 5.0
# Requests one peer may make in a row, then one per SERVE_INTERVAL: an honest node asks each
# author about once a round.
SERVE_BURST = 4
SERVE_INTERVAL_SECONDS = 0.5
MAX_CONCURRENT_SERVES = 8
# A request for which we have nothing newer is held this long, so that the asker gets our next
# group as we publish it, as a gossip subscriber would; at most MAX_HELD at once, one per peer.
HOLD_SECONDS = 3.0
MAX_HELD = 32
# We ask one author at most this often, so that an honest node never meets the limit above
# however fast its rounds are (a tiny model's take a fraction of a second).
ASK_INTERVAL_SECONDS = 2 * SERVE_INTERVAL_SECONDS
# Peers whose request budgets we remember; the least recent make way.
MAX_TRACKED_ASKERS = 4096
# Fetches in flight at once (a held one waits on its author, not on us).
FETCH_CONCURRENCY = 16
# Links dialled only to fetch that stay open (a later round may draw the author again); beyond
# this the oldest is closed, so a node's connections do not grow with the swarm.
FETCH_LINGER = 8
# A fetch that came back short, or whose groups the node refused, is tried again after this long
# (doubling), at most RETRIES times, unless the next round's `want` replaces it first (its
# authors may not have published yet; the node's checks take milliseconds a group).
RETRY_SECONDS = 1.0
RETRIES = 2
# One deadline per author for everything: the dial, whatever its record names (its direct
# addresses, then one relayed address), and the request. An honest author answers at once or
# holds the request up to HOLD_SECONDS; one that holds it longer, or whose record names only
# dead addresses (eight of them took 10 + 7 x 15 s of dial timeouts, issue #41), is a failed
# author, not a reason to wait (fetch_links.py tries a record's addresses within it).
AUTHOR_SECONDS = 5.0
# An author out for this long no longer counts towards what a pass still owes: another is drawn
# beside it (it may still answer, and its groups are handed all the same). A pass draws at most
# DRAW_FACTOR times the authors its groups need, and at least MIN_DRAWN if it must (a swarm where
# most of those drawn fail takes more than one extra), at most FETCH_CONCURRENCY out at once,
# for at most PASS_SECONDS; those still out then finish on their own deadline.
HEDGE_SECONDS = 1.0
DRAW_FACTOR = 2
MIN_DRAWN = 8
PASS_SECONDS = 8.0
# An author that failed us (no answer within its deadline, a dial that failed, a broken answer)
# goes to the back of the draw this long, twice as long for each failure in a row, at most the
# second; an answer forgets it. A timeout while our own loop is behind is not held against it.
FAILED_SKIP_SECONDS = 30.0
FAILED_SKIP_MAX_SECONDS = 600.0
# Of those, drawn in one pass at most (over a link already open, once the fresh are drawn).
FAILING_PER_PASS = 1
# Groups asked of each drawn author. A node publishes its I local groups a round (2 in make
# run), so two a request halves the requests and, where the author must be dialled, the new
# connections (about 60-75 ms of CPU each against 5 ms for a request on an open link,
# docs/bench/scale.md), which are most of a node's network cost in a large swarm. The draw of
# authors stays uniform over the swarm; a round's groups come in pairs from an author.
GROUPS_PER_AUTHOR = 2


class GroupServer:
    """Answers `/sapo/groups/1` from `outbox`, within the limits above (protocol/toolkit/streams.py serves each
    request); the `gate` says whom (protocol/toolkit/peer_gate.py: allow list, bans) and counts."""

    def __init__(self, outbox: Outbox, *, swarm: str, gate: PeerGate) -> None:
        self.outbox = outbox
        self.swarm = swarm
        limits = ServeLimits(
            seconds=STREAM_TIMEOUT_SECONDS,
            total=MAX_CONCURRENT_SERVES,
            per_peer=1,  # an asker waits for its answer before it asks again
            rate=1 / SERVE_INTERVAL_SECONDS,
            burst=SERVE_BURST,
            max_tracked=MAX_TRACKED_ASKERS,
        )
        self.server = StreamServer("fetch", limits, gate)
        self._held: set[ID] = set()  # peers with a request waiting for our next group

    async def handle(self, stream: Any) -> None:
        """Answer one request. Never raises: a bad or slow peer costs its own stream."""
        await self.server.answer(stream, MAX_REQUEST_BYTES, self._respond)

    async def _respond(self, request: Request) -> bytes:
        return encode_response(await self._answer(request))

    async def _answer(self, request: Request) -> list[ServedGroup]:
        asked = decode_request(request.payload)
        if asked.swarm != self.swarm:
            return []
        groups = self.outbox.newer_than(asked)
        if groups or request.peer in self._held or len(self._held) >= MAX_HELD:
            return groups
        # Held outside the serving slots: a wait costs us a stream, not a place in the queue.
        self._held.add(request.peer)
        request.set_aside()
        try:
            return await self.outbox.newer_within(asked, HOLD_SECONDS)
        finally:
            self._held.discard(request.peer)


@dataclass(frozen=True)
class Author:
    """A peer we may ask: its id, if we are not connected to it where to dial it, and the
    network group it is drawn in (protocol/exchange/draw.py)."""

    peer_id: ID
    addrs: tuple[multiaddr.Multiaddr, ...]
    group: str = ""


class GroupFetcher:
    """Brings groups on `want(count)`: from authors drawn by network group from `authors()`,
    handed to `hand` as `Arrival`s by the fetch route; `refused_fetched(count)` tells it that the
    node refused some, which are then owed again. The network passes in its host, its `gate` (who
    may be asked, which peers lack the protocol, the counters), its dialer (`links`), and
    `dial_failed`, which tells discovery of an author its record did not lead to."""

    def __init__(
        self,
        host: Any,
        *,
        swarm: str,
        max_message_bytes: int,
        gate: PeerGate,
        links: Links,
        authors: Callable[[], list[Author]],
        hand: Callable[[Arrival], None],
        dial_failed: Callable[[ID], None] = lambda peer: None,
    ) -> None:
        self.host = host
        self.swarm = swarm
        self.max_message_bytes = max_message_bytes
        self.gate = gate
        self.count = gate.count
        self.authors = authors
        self.hand = hand
        self.dial_failed = dial_failed  # discovery backs the author's record off, and drops it after a few
        self.loop_lag = LoopLag()  # ours: the only overload that stops our dials
        # the newest round we hold from each author, so that it sends each group once
        self._newest: BoundedMap[ID, int] = BoundedMap(MAX_TRACKED_ASKERS)
        self._links = FetchLinks(host, links, self.count, linger=FETCH_LINGER, most=FETCH_LINGER + FETCH_CONCURRENCY)
        self._asked: BoundedMap[ID, float] = BoundedMap(MAX_TRACKED_ASKERS)  # when we last asked each author
        self._failures = Failures(MAX_TRACKED_ASKERS, FAILED_SKIP_SECONDS, FAILED_SKIP_MAX_SECONDS)
        self._out = InFlight(HEDGE_SECONDS)  # authors asked and not yet heard back from, every pass's
        self._wanted = 0  # the size of the latest want
        self._owed = 0  # of it, groups not yet brought, or brought and refused by the node
        self._new_want = False  # a want came that no pass has started on
        self._brought = 0  # groups brought, ever
        self._news = trio.Event()  # set (and replaced) when a want comes or an author is done

    def want(self, count: int) -> None:
        """Fetch `count` groups soon. A want replaces the last one, not adds to it; a pass under
        way takes it up at once, and the next pass starts on it with a fresh draw."""
        if count <= 0:
            return
        self._wanted = self._owed = count
        self._new_want = True
        self._tell()

    def refused_fetched(self, count: int) -> None:
        """The node refused `count` of the groups we brought (no signal, stale, a repeat...): they
        are owed again, up to the latest want's size, and the want's retries ask for them."""
        self._owed = min(self._owed + max(0, count), self._wanted)
        self._tell()

    def _tell(self) -> None:
        self._news.set()
        self._news = trio.Event()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve wants until cancelled; authors still out when a pass ends go on in this nursery."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.loop_lag.run)
            task_status.started()
            while True:
                while not self._new_want:
                    await self._news.wait()
                await self._serve_want(nursery)

    async def _serve_want(self, nursery: trio.Nursery) -> None:
        """Passes for the latest want: the first at once, then, while groups are still owed, at
        most RETRIES more, RETRY_SECONDS apart and doubling (a node too busy to get its groups
        should not answer with more work), unless another want comes first. The want's dials
        are bounded by its groups: were each retry to dial afresh, a node whose dials fail
        would only dial more."""
        dials, delay = self._wanted, RETRY_SECONDS
        for _ in range(1 + RETRIES):
            self._new_want = False
            _, dialled = await self.fetch(self._owed, dials, nursery)
            dials -= dialled
            with trio.move_on_after(delay):  # the node's checks refuse some of what came meanwhile
                while not self._new_want:
                    await self._news.wait()
            if self._owed <= 0 or self._new_want:
                return
            delay *= 2

    async def fetch(self, count: int, dials: int, nursery: trio.Nursery) -> tuple[int, int]:
        """One pass for `count` groups, GROUPS_PER_AUTHOR from each of authors drawn by network group,
        dialling at most `dials` of them: how many groups came during it, and how many authors
        it dialled. Authors still out when it ends go on in `nursery`. While our own loop is
        behind (`loop_lag`), a pass asks only over open links."""
        self._wanted, self._owed = max(self._wanted, count), count
        now = time.monotonic()
        if self.loop_lag.behind():
            self.count("fetch_calm", 1)
            dials = 0
        connected = set(open_peers(self.host))
        authors = self.authors()
        askable = [
            a
            for a in authors
            if now - self._asked.get(a.peer_id, -math.inf) >= ASK_INTERVAL_SECONDS
            and not self.gate.lacks(a.peer_id, PROTOCOL_ID)
            and a.peer_id not in self._out
        ]
        skipped = {a.peer_id for a in authors if self._failures.skips(a.peer_id, now)}
        fresh = [a for a in askable if a.peer_id not in skipped]
        failing = draw_order([a for a in askable if a.peer_id in skipped], attrgetter("group"))
        if any(a.peer_id not in skipped for a in authors):
            # Authors that failed us lately go to the back of the draw: FAILING_PER_PASS of them
            # at most, over links already open (never a dial), asked only once every fresh author
            # askable now is drawn and groups are still owed. Left out altogether, one timeout
            # over a relayed circuit cost a small swarm's node (`make run` has three) an honest
            # peer's groups for 30 s and more; drawn freely, Sybils that hold requests took places
            # in every pass again, and records of tarpits spent the dials (attack on a13e106).
            failing = [a for a in failing if a.peer_id in connected][:FAILING_PER_PASS]
        # else every author we know failed us lately: more likely our own link (a network outage
        # fails them all at once) than theirs, so all are drawn, dials included, or a node would
        # stay deaf for up to 10 minutes after its link came back.
        # `pool.pop()` takes from the end: the fresh in draw order (a network group first, then
        # an author in it, draw.py), then the failing in theirs.
        pool = failing[::-1] + draw_order(fresh, attrgetter("group"))[::-1]
        got, dialled = await self._pass(pool, connected, dials, nursery, failing=len(failing))
        await self._links.close_spare()
        return got, dialled

    async def _pass(
        self, pool: list[Author], connected: set[ID], dials: int, nursery: trio.Nursery, *, failing: int = 0
    ) -> tuple[int, int]:
        """Draw authors from `pool` (from its end) while the groups owed are more than those out
        may still bring, each counted on for HEDGE_SECONDS; at most max(MIN_DRAWN, DRAW_FACTOR
        times the authors the groups need), and FETCH_CONCURRENCY out at once. End when nothing
        is owed, or no one is counted on and no one more may be drawn, or after PASS_SECONDS:
        what is owed then waits for a retry, and those still out may yet bring it."""
        brought, dialled, drawn = self._brought, 0, 0
        most = max(MIN_DRAWN, DRAW_FACTOR * math.ceil(self._owed / GROUPS_PER_AUTHOR))
        with trio.move_on_after(PASS_SECONDS):
            while self._owed > 0:
                news, now = self._news, time.monotonic()
                while pool and drawn < most and len(self._out) < FETCH_CONCURRENCY:
                    owed = self._owed - self._out.expected(now)
                    if owed <= 0:
                        break
                    author = pool.pop()
                    if author.peer_id in self._out:
                        continue  # drawn since the pool was made
                    if author.peer_id not in connected:
                        if dialled >= dials or self.loop_lag.behind():
                            continue  # past the want's dials: the draw goes on among open links
                        dialled += 1
                    # a small pool is asked for more a request, so that it can cover the want; the
                    # `failing` authors at the pool's front are not counted on to share it
                    spread = max(GROUPS_PER_AUTHOR, math.ceil(owed / (max(0, len(pool) - failing) + 1)))
                    groups = min(MAX_GROUPS_PER_RESPONSE, owed, spread)
                    self._out.add(author.peer_id, groups, now)
                    drawn += 1
                    nursery.start_soon(self._fetch_one, author, groups)
                wait = self._out.until_hedge(now)
                if wait == math.inf:
                    break  # no one counted on, and no one more to draw
                with trio.move_on_after(wait):
                    await news.wait()
        return self._brought - brought, dialled

    async def _fetch_one(self, author: Author, max_groups: int) -> None:
        """Connect to `author`, whatever its record names, and ask it, both within AUTHOR_SECONDS;
        hand on what it brings. An author that gives no answer goes to the back of the draw for
        a while (`Failures`), unless our own loop is behind: then the fault is probably ours."""
        groups: list[ServedGroup] | None = None
        reached = False
        try:
            with trio.move_on_after(AUTHOR_SECONDS) as deadline:
                reached = await self._connect(author)
                if reached:
                    after = self._newest.get(author.peer_id, -1)
                    groups = await self._ask(author.peer_id, GroupRequest(self.swarm, after, max_groups))
            if deadline.cancelled_caught:
                self.count("fetch_timeouts", 1)
                if not reached and not self.loop_lag.behind():
                    # The dial itself ran out of time (an address that takes the SYN and never
                    # speaks): as failed as a refused one, so discovery backs the record off and
                    # drops it after a few. Cut off here, `_connect` never got to say so.
                    self.dial_failed(author.peer_id)
            if groups is None:
                if not self.loop_lag.behind():
                    self._failures.failed(author.peer_id, time.monotonic())
                return
            self._failures.answered(author.peer_id)
            self._links.used(author.peer_id)
            for group in groups:
                self._remember(author.peer_id, group.round_index)
                self.count("fetch_bytes", len(group.frame))
                self.hand(Arrival.fetched(author.peer_id.to_base58(), group.frame, time.time()))
            self.count("fetch_groups", len(groups))
            self._owed -= len(groups)
            self._brought += len(groups)
        finally:
            self._out.done(author.peer_id)
            self._tell()

    async def _connect(self, author: Author) -> bool:
        if author.peer_id in set(open_peers(self.host)):
            return True
        self.count("fetch_dials", 1)
        if not await self._links.dial(author.peer_id, author.addrs):
            self.count("fetch_failed", 1)
            self.dial_failed(author.peer_id)
            return False
        await self._links.opened(author.peer_id)
        return True

    async def _ask(self, peer: ID, request: GroupRequest) -> list[ServedGroup] | None:
        """Its answer, or None if it gave none we could read."""
        self.count("fetch_requests", 1)
        self._asked.put(peer, time.monotonic())
        try:
            reply = await streams.ask(
                self.host,
                peer,
                PROTOCOL_ID,
                encode_request(request),
                max_reply_bytes=response_limit(request.max_groups, self.max_message_bytes),
                seconds=STREAM_TIMEOUT_SECONDS,
            )
            return decode_response(reply.payload, request, self.max_message_bytes)
        except FrameError as error:
            self.count("fetch_bad_response", 1)
            logger.info("peer %s answered a group request badly: %s", peer, error)
        except Exception as error:  # noqa: BLE001 - a peer that cannot answer is just not heard from
            if isinstance(error, trio.TooSlowError):
                self.count("fetch_timeouts", 1)
            elif not self.gate.refused(peer, PROTOCOL_ID, error):
                self.count("fetch_failed", 1)
                logger.debug("fetching groups from %s failed: %s: %s", peer, type(error).__name__, error)
        return None

    def _remember(self, peer: ID, round_index: int) -> None:
        self._newest.put(peer, max(round_index, self._newest.get(peer, -1)))
