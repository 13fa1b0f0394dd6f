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
  reaches past the neighbours to the whole swarm. Unconnected authors are dialled (through a relay if that is what their
  record says), and at most FETCH_LINGER such links are kept; older ones are closed.
  An author answers only for itself: Noise authenticated the stream's peer, and the node's
  intake refuses a group whose sender is not that peer. So no one can serve another's group.
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
from typing import Any, Protocol

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from sapo.protocol.exchange.arrivals import Arrival
from sapo.protocol.exchange.draw import draw_order
from sapo.protocol.toolkit import streams
from sapo.protocol.toolkit.frames import FrameError
from sapo.protocol.toolkit.hosts import open_peers
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

# One request/response, stream open included (a dial has its own bound, protocol/reach/dialing.py).
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
# A fetch that came back short is tried again after this long, at most RETRIES times, unless the
# next round's `want` replaces it first (its authors may not have published yet).
RETRY_SECONDS = 2.0
RETRIES = 2
# Passes over fresh authors in one fetch before waiting for the retry.
PASSES = 3
# A request that timed out means a loop (ours, or the author's) is too busy to finish a stream's
# negotiation. A new connection then adds about eight more negotiations and the Noise handshake,
# and past FETCH_LINGER it hangs up a link already paid for: in a 64-node swarm starved of CPU
# that turned a minute's overload into several (docs/bench/scale.md). So for this long after a
# timeout a fetch asks only over open links, and a pass that brought nothing but timeouts ends
# the fetch.
OVERLOAD_SECONDS = 10.0
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


class Links(Protocol):
    """What the fetcher needs of the network's dialer (protocol/reach/dialing.py)."""

    async def dial(self, info: PeerInfo) -> bool:
        """One bounded dial, unless the gate refuses the peer: whether it is connected after."""
        ...

    def keeps(self, peer: ID) -> bool:
        """A link that is not a fetch's to close (bootstrap peers, relays, relayed links)."""
        ...


class GroupFetcher:
    """Brings groups on `want(count)`: from authors drawn by network group from `authors()`,
    handed to `hand` as `Arrival`s by the fetch route. The network passes in its host, its `gate`
    (who may be asked, which peers lack the protocol, the counters), its dialer (`links`), and
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
        self.links = links
        self.authors = authors
        self.hand = hand
        self.dial_failed = dial_failed  # discovery backs the author's record off, and drops it after a few
        send, self._wants = trio.open_memory_channel[int](1)
        self._send_want = send
        # the newest round we hold from each author, so that it sends each group once
        self._newest: BoundedMap[ID, int] = BoundedMap(MAX_TRACKED_ASKERS)
        self._dialled: BoundedMap[ID, None] = BoundedMap(FETCH_LINGER)  # links we opened to fetch, oldest first
        self._asked: BoundedMap[ID, float] = BoundedMap(MAX_TRACKED_ASKERS)  # when we last asked each author
        self._kept: set[ID] = set()  # links we opened that `links.keeps`: not ours to close
        self._timeouts = 0  # requests that timed out, ever
        self._calm_until = -math.inf  # no dials before this (OVERLOAD_SECONDS after a timeout)

    def want(self, count: int) -> None:
        """Fetch `count` groups soon; a want still waiting is replaced, not added to."""
        if count <= 0:
            return
        try:
            self._send_want.send_nowait(count)
        except trio.WouldBlock:
            pass  # one is waiting: its fetch will run, and the next round asks again

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        wanted, retries = 0, 0  # groups still owed from the last want, and tries left for them
        dials = 0  # dials left to the current want
        delay = RETRY_SECONDS
        while True:
            with trio.move_on_after(delay if wanted > 0 and retries > 0 else math.inf) as waiting:
                wanted = await self._wants.receive()
                retries, dials, delay = RETRIES, wanted, RETRY_SECONDS
            if waiting.cancelled_caught:
                retries -= 1
                delay *= 2  # a node too busy to get its groups should not answer with more work
            if wanted > 0:
                got, dialled = await self.fetch(wanted, dials)
                wanted, dials = wanted - got, dials - dialled

    async def fetch(self, count: int, dials: int) -> tuple[int, int]:
        """Up to `count` groups, GROUPS_PER_AUTHOR from each of authors drawn uniformly, dialling
        at most `dials` of them; how many groups came and how many authors were dialled. A want's dials are
        bounded by its groups: a short fetch is retried, and were each retry to dial afresh, a
        node whose dials time out (its loop busy) would only dial more."""
        now = time.monotonic()
        if now < self._calm_until:
            dials = 0
        connected = set(open_peers(self.host))
        pool = [
            a
            for a in self.authors()
            if now - self._asked.get(a.peer_id, -math.inf) >= ASK_INTERVAL_SECONDS
            and not self.gate.lacks(a.peer_id, PROTOCOL_ID)
        ]
        # a network group first, then an author in it (draw.py); `pool.pop()` takes from the end
        pool = draw_order(pool, lambda author: author.group)[::-1]
        got = dialled = 0
        for _ in range(PASSES):
            if got >= count or not pool:
                break
            need = count - got
            chosen: list[Author] = []
            while pool and len(chosen) * GROUPS_PER_AUTHOR < need:
                author = pool.pop()
                if author.peer_id not in connected:
                    if dialled >= dials:
                        continue  # past the want's dials: the draw goes on among open links
                    dialled += 1
                chosen.append(author)
            if not chosen:
                break
            per_author = min(MAX_GROUPS_PER_RESPONSE, math.ceil(need / len(chosen)))
            results: list[int] = []
            limiter = trio.CapacityLimiter(FETCH_CONCURRENCY)
            timeouts = self._timeouts
            async with trio.open_nursery() as nursery:
                for author in chosen:
                    nursery.start_soon(self._fetch_one, author, per_author, limiter, results)
            got += sum(results)
            if self._timeouts > timeouts:
                if not sum(results):
                    break  # overloaded: more passes would only add requests
                dials = dialled  # and no more dials in this one
        return got, dialled

    async def _fetch_one(self, author: Author, max_groups: int, limiter: trio.CapacityLimiter, out: list[int]) -> None:
        async with limiter:
            if not await self._connect(author):
                return
            request = GroupRequest(self.swarm, after=self._newest.get(author.peer_id, -1), max_groups=max_groups)
            groups = await self._ask(author.peer_id, request)
        for group in groups:
            self._remember(author.peer_id, group.round_index)
            self.count("fetch_bytes", len(group.frame))
            self.hand(Arrival.fetched(author.peer_id.to_base58(), group.frame, time.time()))
        self.count("fetch_groups", len(groups))
        out.append(len(groups))

    async def _connect(self, author: Author) -> bool:
        connected = set(open_peers(self.host))
        if author.peer_id in connected:
            return True
        # A relayed link is never closed here (both ends would dial it again, protocol/reach/relayed_links.py),
        # so at most FETCH_LINGER of those we opened stay open; past that, relay-only authors
        # wait until one closes.
        self._kept &= connected
        if len(self._kept) >= FETCH_LINGER and all(is_relayed_addr(a) for a in author.addrs):
            self.count("fetch_relayed_full", 1)
            return False
        self.count("fetch_dials", 1)
        if not author.addrs or not await self.links.dial(PeerInfo(author.peer_id, list(author.addrs))):
            self.count("fetch_failed", 1)
            self.dial_failed(author.peer_id)
            return False
        if self.links.keeps(author.peer_id):
            self._kept.add(author.peer_id)
            return True
        evicted = self._dialled.put(author.peer_id, None)
        if evicted is not None and not self.links.keeps(evicted[0]):
            await self._hang_up(evicted[0])
        return True

    async def _ask(self, peer: ID, request: GroupRequest) -> list[ServedGroup]:
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
            if isinstance(error, trio.TooSlowError):  # our deadline: a loop (ours or its) too busy
                self._timeouts += 1
                self._calm_until = time.monotonic() + OVERLOAD_SECONDS
                self.count("fetch_timeouts", 1)
            if not self.gate.refused(peer, PROTOCOL_ID, error):
                self.count("fetch_failed", 1)
                logger.debug("fetching groups from %s failed: %s: %s", peer, type(error).__name__, error)
        return []

    def _remember(self, peer: ID, round_index: int) -> None:
        self._newest.put(peer, max(round_index, self._newest.get(peer, -1)))

    async def _hang_up(self, peer: ID) -> None:
        with trio.move_on_after(1.0):
            try:
                await self.host.disconnect(peer)
            except Exception as error:  # noqa: BLE001 - already gone is fine
                logger.debug("closing the fetch link to %s failed: %s", peer, error)


def is_relayed_addr(address: multiaddr.Multiaddr) -> bool:
    return "/p2p-circuit" in str(address)
