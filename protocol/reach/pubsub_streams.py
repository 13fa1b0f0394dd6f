"""Pubsub streams opened again: a link whose first pubsub stream failed does not stay deaf.

Why: py-libp2p 0.8.1 opens our pubsub stream to a peer once, when the link comes (its
`connected` notifee -> `Pubsub._handle_new_peer_with_retry`). That loop retries only a
`SwarmException` or `StreamClosed`; a stream whose protocol negotiation timed out (the host's
10 s, raised as `StreamFailure`) is "non-retryable" and given up at once, and so is the retry
its dead-peer path schedules. The link stays up, but the peer is never in `pubsub.peers`, so
nothing we send on any topic reaches it (gossip, IHAVE, our groups for older releases) for as
long as the link lasts. Under load it happened: the 32-node bench's pushers dropped and redialled
1,195 such links by hand (bench/results/standing-swarm/README.md, bench/wild_node.py's
`redial_deaf`).

How: every CHECK_SECONDS, each peer with an open link older than MIN_LINK_SECONDS that is not in
`pubsub.peers` has its stream opened again through the library's own `ensure_peer_stream`
(which opens, sends our subscriptions, registers the peer with the router and starts its
sender, as the first open would have), unless:
- the gate refuses it (banned, not allowed) or pubsub blacklisted it: we never hold such a peer;
- the gate says it lacks gossip (identify does not list it, or it refused the protocol): a relay
  that does not gossip is not asked. A peer identify never answered for is asked, since the stall
  that made the open fail usually made identify fail too; a refusal is then remembered by the
  gate (peers/peer_protocols.py) and it is not asked again for 10 minutes;
- the library is retrying it already (`_peer_stream_retries_pending`), or its wait is not over.

Bounds, as for anything a stranger can cause: at most OPENS_PER_PASS opens a pass, at once, the
peers whose links have lasted longest first, each within OPEN_TIMEOUT_SECONDS (the library's
negotiation has its own 10 s, but its hello, flush and replay writes have none), and the link of
one still running STUCK_SECONDS later cut; after each failed try a peer waits FIRST_WAIT_SECONDS, doubling up to
MAX_WAIT_SECONDS, so one that never accepts our stream costs about 8 tries in its first hour and
4 an hour after that. What is kept per peer (its failed tries) is forgotten when its link ends,
and is at most MAX_REMEMBERED entries whatever happens.

Counts: `pubsub_streams_reopened`, `pubsub_streams_reopen_failed`. This fixes only our half of
a link: a peer whose own stream to us failed must open it again itself (a node of this release
does, here); an older release's stays deaf until the link is made again.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pubsub import Pubsub

from sapo.protocol.toolkit.hosts import connected_seconds, cut_connections, open_peers
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.training.bounded import BoundedMap

logger = logging.getLogger("sapo.gossip")

CHECK_SECONDS = 10.0
# Longer than the host's 10 s protocol negotiation (libp2p's connection config), so the
# library's own first open of a new link has succeeded or given up before we look at it: two
# opens at once would each register a stream, and the first would be left open unused.
MIN_LINK_SECONDS = 15.0
OPENS_PER_PASS = 4
OPEN_TIMEOUT_SECONDS = 15.0
# An open still running this long after its time bound waits where the bound cannot reach it: the
# library resets a failed stream in a shielded scope, and yamux's reset waits on the link's write,
# which a peer that stops reading holds for as long as the link lasts. Its link is then cut, so
# that one such peer does not stop every later pass (h-atk9's finding 2).
STUCK_SECONDS = 5.0
CUT_TIMEOUT_SECONDS = 5.0
FIRST_WAIT_SECONDS = 60.0
MAX_WAIT_SECONDS = 900.0
MAX_REMEMBERED = 1024


@dataclass(frozen=True)
class _Tries:
    failed: int  # tries that did not open the stream, since the link came
    not_before: float  # trio time of the next try


class PubsubStreams:
    """Opens our pubsub stream again to linked peers that lack one (see the module docstring)."""

    def __init__(self, host: Any, pubsub: Pubsub, gate: PeerGate) -> None:
        self.host = host
        self.pubsub = pubsub
        self.gate = gate
        self.protocol = str(pubsub.protocols[0])  # the gossip protocol the gate knows a peer lacks
        self._tries: BoundedMap[ID, _Tries] = BoundedMap(MAX_REMEMBERED)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        next_check = trio.current_time()
        while True:
            next_check = max(next_check + CHECK_SECONDS, trio.current_time())
            await trio.sleep_until(next_check)
            await self.reopen()

    def deaf(self) -> list[ID]:
        """The peers to open a stream to now, the longest-linked first, at most OPENS_PER_PASS;
        forgets the peers whose link has ended."""
        linked = open_peers(self.host)
        gone = set(self._tries) - set(linked)
        for peer in gone:
            self._tries.pop(peer)
        now = trio.current_time()
        pending: set[ID] = getattr(self.pubsub, "_peer_stream_retries_pending", set())  # the library retrying
        due = []
        for peer in linked:
            tries = self._tries.get(peer)
            if peer in self.pubsub.peers:
                if tries is not None:
                    self._tries.pop(peer)  # opened, by us or by the library meanwhile
                continue
            if tries is not None and now < tries.not_before:
                continue
            if peer in pending or connected_seconds(self.host, peer) < MIN_LINK_SECONDS:
                continue
            if not self.gate.may_use(peer) or self.pubsub.is_peer_blacklisted(peer):
                continue
            if self.gate.lacks(peer, self.protocol):
                continue
            # oldest link first: links a stranger remakes are young, and an honest peer whose
            # link has lasted is not kept waiting behind them (h-atk9's finding 3)
            due.append((-connected_seconds(self.host, peer), random.random(), peer))
        return [peer for _, _, peer in sorted(due)[:OPENS_PER_PASS]]

    async def reopen(self) -> int:
        """One pass: open the streams `deaf` names, at once; how many opened."""
        opened = 0

        async def open_one(peer: ID) -> None:
            nonlocal opened
            done = await self._open(peer)  # not `opened += await ...`: that reads `opened` before it waits
            opened += done

        async with trio.open_nursery() as opening:  # one peer that does not answer holds no other
            for peer in self.deaf():
                opening.start_soon(open_one, peer)
        return opened

    async def _open(self, peer: ID) -> bool:
        async with trio.open_nursery() as watching:
            watching.start_soon(self._cut_if_stuck, peer)
            with trio.move_on_after(OPEN_TIMEOUT_SECONDS):
                try:
                    await self.pubsub.ensure_peer_stream(peer, timeout=OPEN_TIMEOUT_SECONDS)
                except Exception as error:  # noqa: BLE001 - a peer's failure is its own, not the pass's
                    logger.debug("pubsub stream to %s: %s: %s", peer, type(error).__name__, error)
            watching.cancel_scope.cancel()
        if peer in self.pubsub.peers:
            self._tries.pop(peer, None)
            self.gate.count("pubsub_streams_reopened")
            logger.info("opened our pubsub stream to %s again: the first open of its link had failed", peer)
            return True
        failed = self._tries.get(peer, _Tries(0, 0.0)).failed + 1
        wait = min(FIRST_WAIT_SECONDS * 2 ** (failed - 1), MAX_WAIT_SECONDS)
        self._tries.put(peer, _Tries(failed, trio.current_time() + wait))
        self.gate.count("pubsub_streams_reopen_failed")
        logger.debug("pubsub stream to %s failed again (%d tries); next in %.0f s", peer, failed, wait)
        return False

    async def _cut_if_stuck(self, peer: ID) -> None:
        await trio.sleep(OPEN_TIMEOUT_SECONDS + STUCK_SECONDS)
        self.gate.count("pubsub_streams_stuck_cut")
        logger.info("our pubsub stream open to %s outlived its time bound: cutting its link", peer)
        with trio.move_on_after(CUT_TIMEOUT_SECONDS):
            await cut_connections(self.host, peer)


__all__ = ["PubsubStreams"]
