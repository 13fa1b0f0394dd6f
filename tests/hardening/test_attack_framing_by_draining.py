"""ATTACK (h-attack2, on main c9a18d3): framing an honest author still works after c9a18d3.

c9a18d3 made a forwarded message cost its author one token and never a charge, so that replaying
an honest author's old messages with gaps after a flush of the guard's memory cannot get it banned
(docs/security.md, "Downgrading the swarm ... Framing by gaps"). But a forwarded message still
*spends the author's bucket* and still *moves its highest sequence number*. So:

1. flush the guard's memory of the honest author A (4,096 fresh keys' messages; or wait for the
   node to restart: the guard is not saved; or catch A when it is new to the node);
2. forward ~100 of A's messages from minutes ago (past libp2p's 120 s seen-cache; the intake
   refuses them as `stale`, free), numbered upwards: A's bucket is empty, its highest number is
   old;
3. A's next message, which A sends itself (a mesh neighbour in gossip mode, the log-probs topic,
   an older release), is `direct`: it is charged the gap to that old number, up to a whole
   bucket (100 points, less what refilled meanwhile).

Twice within a minute is a ban (-100). Pure arithmetic on the real PeerGuard with a fake clock,
with the defaults (50/s, bursts of 100, 4,096 tracked).

XFAIL(strict) on c9a18d3.
"""

from __future__ import annotations

import os

from sapo.protocol.peers.peer_guard import PeerGuard


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_forwarded_replays_after_a_flush_cannot_get_an_honest_author_banned():
    """A publishes its round's 8 groups in a burst every 10 s, sent to us itself. At t = 5 s the
    attacker flushes the guard once, forwards 100 of A's old messages, then more at the bucket's
    own refill rate (50/s), upwards, keeping A's bucket empty until A's next burst."""
    clock = Clock()
    guard = PeerGuard(rate=50.0, burst=100, ban_seconds=300, clock=clock)
    honest = b"honest-author"
    seqno = 1_700_000_000
    old = iter(range(seqno - 10_000, seqno))  # A's messages from minutes before: anyone kept them
    forwarded = 0
    step = 0.02
    for tick in range(int(30 / step)):
        clock.now += step
        t = tick * step
        if tick % int(10 / step) == 0:  # A's round: 8 groups at once
            for _ in range(8):
                seqno += 1
                guard.admit(honest, seqno, direct=True)
        if tick == int(5 / step):
            for _ in range(4_096):  # the flush: fresh keys' messages, each through the guard once
                guard.admit(os.urandom(38), 1, direct=False)
            for _ in range(100):  # A's bucket emptied at once...
                guard.admit(honest, next(old), direct=False)
                forwarded += 1
        if t >= 5:  # ...and kept empty: one old message of A's per tick, 50 a second, upwards
            guard.admit(honest, next(old), direct=False)
            forwarded += 1
        if guard.is_banned(honest):
            break
    print(f"after {t:.1f} s ({forwarded} old messages forwarded): banned {guard.is_banned(honest)}")
    assert not guard.is_banned(honest)
