"""Per-peer score and rate guard: a flooder, or a peer that keeps sending junk, is banned for a while.

Every message a peer *authors* (the signer, checked before anything here is asked) draws from
that peer's token bucket (`rate` per second, up to `burst`) as many tokens as it stands for
publishes: its signed sequence number minus the highest one we have seen from that author
(at most `burst`). A number at or below the highest is a reorder, or a replay that anyone may
forward once libp2p forgets the message (120 s): it draws on a second bucket of the same size and,
when that is empty, is dropped (`replayed`) without charging the author, so that nobody can spend
an honest author's bucket or score by replaying its messages. libp2p numbers an author's
publishes one by one, so this counts what the author sends, not what reaches us: a node that
trains on a busy CPU reads only ~35-50 messages a second from one peer (TCP backpressure
throttles a 400/s flood long before it arrives, and the flooder's own send queue drops the
rest), which by arrivals alone looks like an honest tiny-model node (~27/s here); by sequence
numbers the flooder is 10x over.

A message over the bucket is dropped and costs the author one point of score per publish over
the limit; a message that fails a check costs more (see `PENALTIES`). Score drifts back towards
0 by `RECOVERY_PER_SECOND`, so an honest peer's rare slip is forgotten, while a peer publishing
at 100x the normal rate loses hundreds of points a second and crosses `BAN_SCORE` at once. A
banned peer is disconnected by the gossip layer, refused when it reconnects, and its messages
are dropped unread until the ban expires. A flooder that numbers its messages 1, 2, 3... is
held to `rate` by arrivals instead (it cannot get more through than that, but it may not be
banned while the node is too busy to read faster).

py-libp2p 0.8.1 has GossipSub v1.1 peer scoring, but it never disconnects anyone, it scores
forwarders rather than authors, and it knows nothing of our application's rejections (a spoofed
answer key is a valid libp2p message). So the node keeps its own, small score.

Only authenticated ids are scored (the signer of a valid signature, or the directly connected
peer for transport-level junk), so one peer cannot get another banned. A swarm of sybil
identities is not addressed here: each fresh key gets a full bucket (`--allow-peers` or a
`--swarm-key` is the defence against that).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sapo.protocol.toolkit.buckets import TokenBucket
from sapo.training.bounded import BoundedMap

# Score at or below which a peer is banned. With RECOVERY_PER_SECOND = 1 a peer may run at most
# one point a second in deficit forever; 100 points is 100 s of slack for bursts and slips.
BAN_SCORE = -100.0
RECOVERY_PER_SECOND = 1.0
# What one offence costs. Each publish over the bucket costs 1: an honest node a little over the
# rate (60/s against 50/s) takes ~20 s to get banned, and loses its excess messages anyway, so
# set the rate above any honest publisher's; a 400/s flooder is 350 points a second in deficit.
# Provably hostile input costs 10; version skew between honest nodes costs nothing.
PENALTIES: dict[str, float] = {
    "rate_limited": 1.0,
    # The forwarder of a message we verified for nothing: one dropped as a replay (numbered at or
    # below its author's highest, past that author's bucket of such messages) or past its
    # author's bucket for forwarded messages. A signature check costs us about 150 µs and the
    # sender 24 µs to sign; nobody else can be charged for it. 100 dropped ones a minute are a
    # ban. Reordered messages within the bucket cost nobody: gossip reorders honest messages.
    "wasted_check": 1.0,
    # transport: the direct peer sent it (honest peers validate before they forward)
    "unsigned": 10.0,
    "bad_signature": 10.0,
    "malformed_message": 10.0,
    "malformed_frame": 50.0,
    "oversized": 10.0,
    # intake: the signer wrote it
    "bad_frame": 10.0,
    "bad_compression": 10.0,
    "bad_msgpack": 10.0,
    "bad_schema": 10.0,
    "too_deep": 10.0,
    "field_too_long": 10.0,
    "too_many_completions": 10.0,
    "spoofed_answer_key": 10.0,
    "sender_mismatch": 10.0,
    # an honest node never republishes its own group under a fresh timestamp: a replay that dodges
    # the frame check, to be trained on again
    "repeat": 5.0,
    # a node with a newer allowlist or task table sends these honestly: cheap, like a rate overrun
    "config_out_of_range": 1.0,
    "unknown_dataset": 1.0,
    # A group whose completions all score alike here cannot teach the receiver (intake: no_signal).
    # Honest nodes send them all the time: a weak model's groups are mostly all wrong (the untrained
    # tiny model's every group, ~5 a second), a strong one's all right. So it costs 1/50 of a point:
    # at the 50/s rate limit, the most any peer can publish for long, a peer whose every group is
    # flat loses what its score regains each second, so its score never drifts down; a burst of a
    # full bucket (100) costs 2 points, back to 0 within 2 s. It refuses the flooder nothing it
    # could use (the group takes no inbox room) and adds to its other offences.
    "no_signal": 0.02,
    # Over the author's budget of verified groups a second (intake.VERIFY_RATE, above any honest
    # node's rate): refused before the expensive check, charged like a publish over the bucket. A
    # peer sending flat groups at the gossip limit (50/s) is 10/s over: banned in ~20 s.
    "over_budget": 1.0,
    # A group whose scoring ran past its CPU budget (protocol/wire/verify.py: 100 times an honest
    # group's cost): no honest node sends one, and each costs us 100 ms of the verification worker.
    "too_costly": 10.0,
    # `stale` costs nothing on purpose: a frame past the age window is what anyone can replay of
    # an honest author's history once the duplicate memories forget it, so charging its author
    # would let a replayer get an honest peer banned. A stale frame costs us a decode, is bounded
    # by the author's bucket, and enters no memory (it cannot flush one).
}


@dataclass
class _PeerState:
    publishes: TokenBucket  # what the author may publish, by what it sends us itself
    replays: TokenBucket  # messages numbered at or below the highest: reorders, or replays anyone can forward
    relayed: TokenBucket  # its new messages that others forward: dropped past it, nobody charged
    score: float
    updated: float  # when the score last recovered
    banned_until: float = 0.0
    highest_seqno: int | None = None  # the highest of its numbers we have seen, by any route
    direct_seqno: int | None = None  # the highest it sent us itself: its gaps are its publishes


class PeerGuard:
    """Token bucket + decaying score per peer id (bytes); pure bookkeeping, no I/O.

    The caller acts on the verdicts: `admit` says whether to process a message, `penalize`
    returns True when that call banned the peer (disconnect it then)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        ban_seconds: float,
        max_tracked: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.ban_seconds = ban_seconds
        self.max_tracked = max_tracked
        self.clock = clock
        # Least recently heard first; beyond max_tracked the quietest peer is forgotten, in O(1).
        # Banned peers are kept apart, oldest ban first, so that no stream of fresh keys pushes a
        # ban out early (the peer would come back with a clean slate) and no eviction scans them.
        self._peers: BoundedMap[bytes, _PeerState] = BoundedMap(max_tracked)
        self._bans: BoundedMap[bytes, _PeerState] = BoundedMap(max_tracked)

    def admit(self, peer: bytes, seqno: int | None = None, *, direct: bool = True) -> str | None:
        """None if a message authored by `peer` (with its signed `seqno`) may go on, else why not:
        'banned', 'replayed' (an old number past its own small bucket: dropped, nobody charged),
        or 'rate_limited' (dropped; the author is charged, and may be banned now, only if it sent
        the message itself: `direct`).

        A message another peer forwarded says nothing of its author's pace: anyone may forward
        any signed message, in any order, and after a flush of this memory (4,096 fresh keys) a
        replay of an honest author's old messages, numbered with gaps, would have charged it each
        gap and banned it. So a forwarded message costs one token, and a full bucket drops it
        without a charge."""
        now = self.clock()
        state = self._state(now, peer)
        if state.banned_until:
            return "banned"
        cost = 1.0
        if seqno is not None:
            if state.highest_seqno is not None and seqno <= state.highest_seqno:
                # A reordered message was paid for by the gap before it; a replayed one may be
                # forwarded by anyone (libp2p forgets seen ids after 120 s), so it is never
                # charged to its author: it draws on a bucket of its own and is only dropped.
                return None if state.replays.take(now) else "replayed"
            state.highest_seqno = seqno
            if direct:
                # Only the numbers it sent us itself measure its pace: what others forwarded,
                # old messages replayed after a flush of this memory included, moves nothing here.
                if state.direct_seqno is not None:
                    cost = float(min(max(seqno - state.direct_seqno, 1), self.burst))
                state.direct_seqno = seqno
        if not direct:
            return None if state.relayed.take(now) else "rate_limited"
        over = state.publishes.take_short(now, cost)
        if not over:
            return None
        self.penalize(peer, "rate_limited", times=over)
        return "rate_limited"

    def penalize(self, peer: bytes, reason: str, times: float = 1.0) -> bool:
        """Charge `peer` for `times` offences; True if this is what banned it."""
        amount = PENALTIES.get(reason, 0.0) * times
        if amount <= 0:
            return False
        now = self.clock()
        state = self._state(now, peer)
        if state.banned_until:
            return False
        state.score -= amount
        if state.score > BAN_SCORE:
            return False
        state.banned_until = now + self.ban_seconds
        self._peers.pop(peer)
        self._bans.put(peer, state)  # past max_tracked bans, the oldest is served early
        return True

    def is_banned(self, peer: bytes) -> bool:
        return peer in self._bans and self._state(self.clock(), peer).banned_until > 0

    def banned(self) -> list[bytes]:
        now = self.clock()
        return [peer for peer in list(self._bans) if self._state(now, peer).banned_until]

    def score(self, peer: bytes) -> float:
        return self._state(self.clock(), peer).score

    def _state(self, now: float, peer: bytes) -> _PeerState:
        state = self._bans.get(peer)
        if state is not None and now >= state.banned_until:
            # the ban is served: a clean slate, as if we had never met (its numbering aside)
            self._bans.pop(peer)
            state.banned_until, state.score = 0.0, 0.0
            state.publishes, state.replays, state.relayed = self._full(now), self._full(now), self._full(now)
            self._peers.put(peer, state)
        elif state is None:
            state = self._peers.get(peer)
            if state is None:
                state = self._fresh(now)
                self._peers.put(peer, state)  # past max_tracked, the quietest peer is forgotten
                return state
            self._peers.touch(peer)
        elapsed = max(0.0, now - state.updated)
        state.updated = now
        state.publishes.refill(now)
        state.replays.refill(now)
        state.relayed.refill(now)
        state.score = min(0.0, state.score + elapsed * RECOVERY_PER_SECOND)
        return state

    def _fresh(self, now: float) -> _PeerState:
        return _PeerState(
            publishes=self._full(now), replays=self._full(now), relayed=self._full(now), score=0.0, updated=now
        )

    def _full(self, now: float) -> TokenBucket:
        return TokenBucket(self.rate, self.burst, now)
