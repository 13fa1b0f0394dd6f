"""The records behind authors' standing (sampling/standing.py), bounded so that fresh keys cannot
push out the authors who earned their place.

The bound is split in two halves, each evicted in O(1):

- **newcomers**, authors whose clock has not yet run its ramp, kept in the order their clock
  started. When the half is full a fresh key takes the place of the newest newcomer, the one that
  has earned least: a flood of fresh keys churns one slot among itself, and the newcomers that
  came before it keep theirs.
- **established**, authors whose clock has run its ramp, least recently credited first. A
  newcomer moves here once its ramp has run (checked at every credit, from the oldest newcomer
  on, each record once). When this half is full, the least recently credited established author
  makes room only if it has been silent for `idle_seconds` (it left); otherwise the one arriving,
  the newest of them all, is not kept and starts again as a newcomer at its next group.

So keys that were never credited cannot evict anyone established, however many they are: to
displace an established author, an attacker needs more keys of its own past their ramp than
the established half holds, each of them asked for by this node (standing.py's `Provenance`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sapo.training.bounded import BoundedMap


@dataclass
class Record:
    since: float  # when its clock started: its first group that earned, or the first after a silence
    last: float  # its latest group that earned
    groups: int = 1  # groups that earned, since its clock started
    dropped: float = 0.0  # the share of its screened completions the screen dropped, recent groups weighing most
    place: str | None = None  # the network group its connection came from (None: not known)


class StandingTable:
    def __init__(self, max_authors: int, ramp_seconds: float, idle_seconds: float):
        self.newcomer_slots = max(1, max_authors // 2)
        self.established_slots = max(1, max_authors - self.newcomer_slots)
        self.ramp_seconds = ramp_seconds
        self.idle_seconds = idle_seconds
        self._newcomers: BoundedMap[str, Record] = BoundedMap(self.newcomer_slots)  # oldest clock first
        self._established: BoundedMap[str, Record] = BoundedMap(self.established_slots)  # least recently credited first

    def __len__(self) -> int:
        return len(self._newcomers) + len(self._established)

    def get(self, author: str) -> Record | None:
        return self._established.get(author) or self._newcomers.get(author)

    def credited(self, author: str, now: float) -> Record:
        """`author`'s record after a group of its earned at `now`: a fresh one for a key not held."""
        self._promote(now)
        record = self._established.get(author)
        if record is not None and now - record.last <= self.idle_seconds:
            self._established.touch(author)
        elif record is not None:  # back after a silence: its clock starts again
            self._established.pop(author)
            return self._fresh(author, now, record)
        else:
            record = self._newcomers.get(author)
            if record is None:
                return self._fresh(author, now)
            if now - record.last > self.idle_seconds:
                self._newcomers.pop(author)
                return self._fresh(author, now, record)
        record.last = now
        record.groups += 1
        return record

    def _fresh(self, author: str, now: float, former: Record | None = None) -> Record:
        newest = self._newcomers.newest()
        if newest is not None and len(self._newcomers) >= self.newcomer_slots:
            self._newcomers.pop(newest[0])  # the newest newcomer: the one that earned least
        # what the screen found in its groups outlives a silence, and so does its place
        record = Record(now, now, dropped=former.dropped if former else 0.0, place=former.place if former else None)
        self._newcomers.put(author, record)
        return record

    def _promote(self, now: float) -> None:
        """Move every newcomer whose ramp has run to the established half (oldest first, so the
        loop stops at the first one still running)."""
        while (oldest := self._newcomers.oldest()) is not None and now - oldest[1].since >= self.ramp_seconds:
            self._newcomers.pop_oldest()
            self._establish(*oldest, now)

    def _establish(self, author: str, record: Record, now: float) -> None:
        least_recent = self._established.oldest()
        if least_recent is not None and len(self._established) >= self.established_slots:
            if now - least_recent[1].last <= self.idle_seconds:
                return  # full of authors heard this week: the newest of them waits for a place
            self._established.pop_oldest()
        self._established.put(author, record)

    def records(self) -> tuple[list[tuple[str, Record]], list[tuple[str, Record]]]:
        """(newcomers, oldest clock first; established, least recently credited first)."""
        return list(self._newcomers.items()), list(self._established.items())

    def load(self, newcomers: list[tuple[str, Record]], established: list[tuple[str, Record]]) -> None:
        """Hold these records, in these orders (`records`' own), as far as the bounds allow: the
        newcomers with the oldest clocks, the established authors credited most recently."""
        self._newcomers = BoundedMap(
            self.newcomer_slots, sorted(newcomers, key=lambda item: item[1].since)[: self.newcomer_slots]
        )
        self._established = BoundedMap(self.established_slots, established)  # the least recent make way

    def __iter__(self) -> Iterator[str]:
        yield from self._newcomers
        yield from self._established
