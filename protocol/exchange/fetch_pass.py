"""The bookkeeping of a fetch that no author can stall (issue #41), for group_fetch.py's fetcher:

- `InFlight`: the authors one pass has asked and not heard back from. An author counts towards
  the groups still owed only for `hedge` seconds after it was drawn; past that the pass draws
  another in its place, and the first may still answer (its groups are handed all the same).
  So a pass waits on its fastest authors, not its slowest.
- `Failures`: authors that failed us lately (no answer within their deadline, a dial that
  failed, a broken answer). Each is skipped for a while, twice as long for each failure in a
  row, and forgotten once it answers: an author that holds its stream open, or whose record
  names only dead addresses, costs one deadline, then goes to the back of the draw: one a
  pass at most, over an open link, once the fresh authors are drawn (group_fetch.py).

Both are plain values over a clock the caller passes in; neither touches the network.
"""

from __future__ import annotations

import math

from libp2p.peer.id import ID

from sapo.training.bounded import BoundedMap


class InFlight:
    """Authors drawn by one pass and still out: when each was drawn, and for how many groups."""

    def __init__(self, hedge_seconds: float) -> None:
        self.hedge_seconds = hedge_seconds
        self._out: dict[ID, tuple[float, int]] = {}

    def __len__(self) -> int:
        return len(self._out)

    def __contains__(self, peer: object) -> bool:
        return peer in self._out

    def add(self, peer: ID, groups: int, now: float) -> None:
        self._out[peer] = (now, groups)

    def done(self, peer: ID) -> None:
        self._out.pop(peer, None)

    def expected(self, now: float) -> int:
        """Groups that the authors drawn less than `hedge_seconds` ago may still bring."""
        return sum(groups for since, groups in self._out.values() if now - since < self.hedge_seconds)

    def until_hedge(self, now: float) -> float:
        """Seconds until the next author still counted on stops being counted on (inf if none)."""
        return min(
            (since + self.hedge_seconds - now for since, _ in self._out.values() if now - since < self.hedge_seconds),
            default=math.inf,
        )


class Failures:
    """Authors to put at the back of the draw for a while: `skip_seconds` after a failure, doubling with
    each failure in a row up to `most_seconds`; an answer forgets the author. At most `capacity`
    are remembered, the least recently failed making way."""

    def __init__(self, capacity: int, skip_seconds: float, most_seconds: float) -> None:
        self.skip_seconds = skip_seconds
        self.most_seconds = most_seconds
        self._failed: BoundedMap[ID, tuple[float, int]] = BoundedMap(capacity)  # skipped until, failures in a row

    def __len__(self) -> int:
        return len(self._failed)

    def failed(self, peer: ID, now: float) -> None:
        _, in_a_row = self._failed.get(peer, (0.0, 0))
        wait = min(self.most_seconds, self.skip_seconds * 2 ** min(in_a_row, 30))
        self._failed.put(peer, (now + wait, in_a_row + 1))

    def answered(self, peer: ID) -> None:
        self._failed.pop(peer)

    def skips(self, peer: ID, now: float) -> bool:
        until, _ = self._failed.get(peer, (-math.inf, 0))
        return now < until
