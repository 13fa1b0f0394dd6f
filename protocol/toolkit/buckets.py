"""The one token bucket: what a peer (or the whole relay) may spend, refilled with time.

Every rate limit of the node is one of these, each with its own parameters:
- the intake's verifications per author (node/core/intake.py): 40 a second, bursts of 100, and a
  CPU debt down to minus one burst (`floor`), which later refills pay back first;
- `/sapo/groups/1` requests per peer (protocol/exchange/group_fetch.py): 4 in a row, then one per 0.5 s;
- gossip messages per author and its replays (protocol/peers/peer_guard.py): a publish over the bucket spends
  what is left, and the shortfall is what the author is charged;
- the relay's bytes (protocol/reach/relay_guards.py): a rate that may run into any debt (later bytes wait it
  out) and an hour's worth that cuts circuits once spent.

`TokenBuckets` keeps one bucket per key (a peer, an author), at most `capacity` of them: the
least recently used is forgotten, and comes back with a full bucket.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from sapo.training.bounded import BoundedMap

K = TypeVar("K", bound=Hashable)

# A `floor` for a bucket whose debt is waited out rather than refused (the relay's byte rate).
UNBOUNDED_DEBT = -math.inf


class TokenBucket:
    """Tokens that come back at `rate` a second up to `burst`, starting full at `now`. A take
    spends them; `charge` spends whether or not they are there, down to `floor` (a debt)."""

    __slots__ = ("burst", "floor", "rate", "tokens", "updated")

    def __init__(
        self, rate: float, burst: float, now: float, *, floor: float = 0.0, tokens: float | None = None
    ) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.floor = floor
        self.tokens = self.burst if tokens is None else tokens
        self.updated = now

    def refill(self, now: float) -> float:
        """The tokens at `now`; a clock that went back adds none."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.updated) * self.rate)
        self.updated = now
        return self.tokens

    def take(self, now: float, cost: float = 1.0) -> bool:
        """Spend `cost` tokens if there are that many; whether there were."""
        if self.refill(now) < cost:
            return False
        self.tokens -= cost
        return True

    def take_short(self, now: float, cost: float) -> float:
        """Spend `cost` tokens, or all there are when there are fewer: how many were missing."""
        tokens = self.refill(now)
        if tokens >= cost:
            self.tokens = tokens - cost
            return 0.0
        self.tokens = 0.0
        return cost - tokens

    def charge(self, cost: float, now: float | None = None) -> None:
        """Spend `cost` tokens whatever is left, down to `floor`; refilled to `now` first, if given
        (else what it held when last refilled pays, as the intake charges a verification's CPU)."""
        if now is not None:
            self.refill(now)
        self.tokens = max(self.floor, self.tokens - cost)

    def debt_seconds(self) -> float:
        """How long until the bucket is out of debt (0.0 when it is not in debt)."""
        return max(0.0, -self.tokens / self.rate)


class TokenBuckets(Generic[K]):
    """One `TokenBucket` per key, the `capacity` most recently used: a key over capacity is
    forgotten, least recently used first, and starts again with a full bucket."""

    def __init__(self, rate: float, burst: float, capacity: int, *, floor: float = 0.0) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.floor = floor
        self._buckets: BoundedMap[K, TokenBucket] = BoundedMap(capacity)

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: K, now: float, cost: float = 1.0) -> bool:
        """Spend `cost` of `key`'s tokens if it has that many (its bucket becomes the most
        recently used either way); whether it had."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(self.rate, self.burst, now, floor=self.floor)
        self._buckets.put(key, bucket)
        return bucket.take(now, cost)

    def charge(self, key: K, cost: float, now: float | None = None) -> None:
        """Spend `cost` of `key`'s tokens whatever it has left, down to the floor (a debt its
        refills pay back first), refilled to `now` first if given; nothing for a key not held."""
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.charge(cost, now)

    def entries(self) -> list[tuple[K, float, float]]:
        """(key, tokens, when last refilled) of each bucket, least recently used first."""
        return [(key, bucket.tokens, bucket.updated) for key, bucket in self._buckets.items()]

    def restore(self, saved: Iterable[tuple[K, float, float]]) -> None:
        """Replace the buckets by what `entries` gave."""
        self._buckets = BoundedMap(
            self._buckets.capacity,
            (
                (key, TokenBucket(self.rate, self.burst, updated, floor=self.floor, tokens=tokens))
                for key, tokens, updated in saved
            ),
        )
