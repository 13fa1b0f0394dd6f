"""Each author's standing with this node: influence over what it trains on, earned over time.

Identities are free, so a stranger's say in what a node learns cannot follow how many keys it
holds. It follows what is costly to fake at scale instead: time spent delivering groups that this
node verified and that carried signal. An author's standing rises from 0 to 1 over
`ramp_seconds` of such activity (a gap between two of its groups counts for at most
`MAX_GAP_SECONDS`, so the time must be spent sending, not waiting), and a group of its that the
screen refused (sampling/screen.py) costs it `STRIKE_SECONDS` of that time.

Weights (what the inbox's eviction and the external draw use):
- an author with standing s has weight s, plus its part of the newcomers' budget;
- every author below full standing shares one budget, `newcomer_share` (in units of one
  established author): n fresh keys together weigh as much as one, whatever n is.

So when every author is new (a swarm starting together) all weigh alike, as before; a Sybil
that adds keys only splits the newcomers' budget finer.

Authors seen behind one network address group (`locate`: the network layer tells where a
directly connected author's connection comes from, /16 for IPv4 as Bitcoin Core buckets peers)
share one budget too: the group weighs what its best author weighs, split evenly among them, so
keys minted on one machine or one provider's block add nothing to each other.

The records are bounded (`max_authors`, least recently credited forgotten first). They are
part of the node's memory of its peers, saved in its checkpoints (node/core/memory.py).

With `mode="off"` (`--standing off`) nothing is earned and every group weighs alike: an
author's weight is the number of groups it holds, so the inbox evicts the oldest group and the
draw is uniform over groups, as before standing existed.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from sapo.training.bounded import BoundedMap

# A gap between an author's groups that counts towards its standing: an honest node publishes
# every round (seconds to a minute); a key that waits an hour between groups earns no more than
# one that waited a minute.
MAX_GAP_SECONDS = 60.0
# Default time to full standing, and what a refused group costs: an author caught more often
# than once per STRIKE / MAX_GAP of its groups never gets anywhere, an honest author's rare
# false alarm costs it two minutes.
RAMP_SECONDS = 600.0
STRIKE_SECONDS = 120.0
MAX_AUTHORS = 4096


@dataclass
class _Record:
    earned: float = 0.0  # seconds of activity credited
    last: float | None = None  # when its last credited group arrived
    place: str | None = None  # the network address group its connection came from, if known


class Standing:
    def __init__(
        self,
        ramp_seconds: float = RAMP_SECONDS,
        newcomer_share: float = 0.1,
        max_authors: int = MAX_AUTHORS,
        mode: Literal["earned", "off"] = "earned",
    ):
        if ramp_seconds <= 0 or newcomer_share <= 0 or max_authors < 1:
            raise ValueError("standing needs a positive ramp, newcomer share and author bound")
        self.earned = mode == "earned"
        self.ramp_seconds = ramp_seconds
        self.newcomer_share = newcomer_share
        self.max_authors = max_authors
        self._records: BoundedMap[str, _Record] = BoundedMap(max_authors)  # least recently credited first
        # Credits arrive from the network's worker thread while the round reads weights.
        self._lock = threading.Lock()

    def credit(self, author: str, now: float) -> None:
        """A group of `author`'s was verified and carried signal, at `now`."""
        if not self.earned:
            return
        with self._lock:
            record = self._records.pop(author, None) or _Record()
            if record.last is not None:
                record.earned += min(max(now - record.last, 0.0), MAX_GAP_SECONDS)
            record.last = now
            self._records.put(author, record)  # most recently credited last

    def locate(self, author: str, place: str | None) -> None:
        """`author` was last seen connected from network address group `place` (None: not directly)."""
        if not self.earned:
            return
        with self._lock:
            record = self._records.get(author)
            if record is not None and place is not None:
                record.place = place

    def strike(self, author: str) -> None:
        """A group of `author`'s was refused by the screen."""
        with self._lock:
            record = self._records.get(author)
            if record is not None:
                record.earned = max(0.0, record.earned - STRIKE_SECONDS)

    def of(self, author: str) -> float:
        """Standing in [0, 1]."""
        with self._lock:
            record = self._records.get(author) or _Record()
        return self._standing(record)

    def _standing(self, record: _Record) -> float:
        return min(1.0, record.earned / self.ramp_seconds)

    def weights(self, held: Mapping[str, int] | Iterable[str]) -> dict[str, float]:
        """Each author's weight among the authors of `held` (author -> groups it holds, or one
        author per group): its standing plus its share of the newcomers' budget, shared with the
        authors seen in its network address group; with standing off, the groups it holds."""
        counts = Counter(held) if not isinstance(held, Mapping) else held
        if not self.earned:
            return {author: float(count) for author, count in counts.items()}
        with self._lock:
            known = {a: self._records.get(a) or _Record() for a in counts}
        standing = {a: self._standing(r) for a, r in known.items()}
        newcomers = sum(1 for s in standing.values() if s < 1.0)
        alone = {a: s + (self.newcomer_share * (1.0 - s) / newcomers if s < 1.0 else 0.0) for a, s in standing.items()}
        places: dict[str, list[str]] = {}
        for author, record in known.items():
            places.setdefault(record.place or f"author:{author}", []).append(author)
        return {a: max(alone[b] for b in members) / len(members) for members in places.values() for a in members}

    def draw_weights(self, authors: Iterable[str]) -> dict[str, float] | None:
        """What the external draw weighs each author by (sampling/strategies.py); None with
        standing off, the samplers' own draw where every group weighs alike."""
        return self.weights(authors) if self.earned else None

    def to_json(self) -> list[list]:
        """Each author's record, least recently credited first: [author, earned, last, place]."""
        with self._lock:
            return [[author, r.earned, r.last, r.place] for author, r in self._records.items()]

    def restore(self, saved: list[list]) -> None:
        """Take the records `to_json` saved (a study's run resumes with its nodes' standing as it was)."""
        with self._lock:
            self._records = BoundedMap(
                self.max_authors, ((author, _Record(earned, last, place)) for author, earned, last, place in saved)
            )
