"""A bounded store of external question groups: caps on count, bytes, age and per-peer share."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from sapo.training.rollouts import QuestionGroup


@dataclass(frozen=True)
class InboxEntry:
    group: QuestionGroup
    size_bytes: int
    received_at: float


def group_size_bytes(group: QuestionGroup) -> int:
    text = group.problem.question + group.problem.answer + "".join(group.completions)
    return len(text.encode("utf-8"))


class Inbox:
    """Oldest-first eviction. One peer may hold at most `peer_share` of the slots: past that,
    its own oldest group makes way, so a flooder only churns its own share."""

    def __init__(self, max_groups: int, max_bytes: int, max_age_seconds: float, peer_share: float = 1.0):
        if max_groups < 1 or max_bytes < 1 or max_age_seconds <= 0:
            raise ValueError("inbox bounds must be positive")
        self.max_groups = max_groups
        self.max_bytes = max_bytes
        self.max_age_seconds = max_age_seconds
        self.per_peer_max = max(1, int(max_groups * peer_share))
        self._entries: OrderedDict[int, InboxEntry] = OrderedDict()
        self._next_id = 0
        self._bytes = 0
        self._per_peer: dict[str, int] = {}
        self.evicted = 0
        # Verified groups arrive from the network's worker thread while the round loop samples.
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def add(self, group: QuestionGroup, now: float) -> bool:
        """Store a verified group; False if it alone exceeds the byte cap."""
        with self._lock:
            size = group_size_bytes(group)
            if size > self.max_bytes:
                return False
            self.prune(now)
            if self._per_peer.get(group.origin, 0) >= self.per_peer_max:
                self._evict(next(k for k, e in self._entries.items() if e.group.origin == group.origin))
            while len(self._entries) >= self.max_groups or self._bytes + size > self.max_bytes:
                self._evict(next(iter(self._entries)))
            self._entries[self._next_id] = InboxEntry(group, size, now)
            self._next_id += 1
            self._bytes += size
            self._per_peer[group.origin] = self._per_peer.get(group.origin, 0) + 1
            return True

    def prune(self, now: float) -> None:
        with self._lock:
            while self._entries:
                key, entry = next(iter(self._entries.items()))
                if now - entry.received_at <= self.max_age_seconds:
                    break
                self._evict(key)

    def newest_first(self, now: float) -> list[QuestionGroup]:
        with self._lock:
            self.prune(now)
            return [e.group for e in reversed(self._entries.values())]

    def take(self, groups: list[QuestionGroup]) -> None:
        """Remove groups that were trained on, so a later round does not train on them again."""
        with self._lock:
            chosen = {id(g) for g in groups}
            for key in [k for k, e in self._entries.items() if id(e.group) in chosen]:
                self._evict(key, count=False)

    def peers(self) -> list[str]:
        return sorted(self._per_peer)

    def _evict(self, key: int, count: bool = True) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.size_bytes
        origin = entry.group.origin
        self._per_peer[origin] -= 1
        if not self._per_peer[origin]:
            del self._per_peer[origin]
        self.evicted += int(count)
