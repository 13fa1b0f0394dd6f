"""A bounded store of external question groups: caps on count, bytes, age and per-peer share.

A full inbox makes room by evicting from the author holding the most groups for its weight
(sampling/standing.py), the oldest group of those that hold the most, so slots go to authors in
proportion to their standing: fresh keys, however many, churn among themselves in the
newcomers' share and never push out the groups of authors who earned theirs. A group whose
author would be that victim itself is not stored (`crowded_out`). With standing off an author
weighs the groups it holds, so the oldest group goes, whoever sent it."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from sapo.sampling.standing import Standing
from sapo.training.problems.rollouts import QuestionGroup


@dataclass(frozen=True)
class InboxEntry:
    group: QuestionGroup
    size_bytes: int
    received_at: float


# What a shared log-probability costs in memory: a Python float in a list.
BYTES_PER_LOGPROB = 8


def group_size_bytes(group: QuestionGroup) -> int:
    """What the inbox's byte cap counts of a group: its text, and its log-probs if it has them."""
    text = group.problem.question + group.problem.answer + "".join(group.completions)
    logprobs = sum(len(row) for row in group.behavior.token_logprobs) if group.behavior is not None else 0
    return len(text.encode("utf-8")) + BYTES_PER_LOGPROB * logprobs


class Inbox:
    """Oldest-first eviction. One peer may hold at most `peer_share` of the slots: past that,
    its own oldest group makes way, so a flooder only churns its own share."""

    def __init__(
        self,
        max_groups: int,
        max_bytes: int,
        max_age_seconds: float,
        peer_share: float = 1.0,
        standing: Standing | None = None,  # default: standing off
    ):
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
        self.standing = standing if standing is not None else Standing(mode="off")
        self.crowded_out = 0  # groups not stored: their author stood lowest for what it already held
        # Verified groups arrive from the network's worker thread while the round loop samples.
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def add(self, group: QuestionGroup, now: float) -> bool:
        """Store a verified group (what its author earns for it is the node's memory's to credit,
        node/core/memory.py); False if it alone exceeds the byte cap. A group crowded out by
        authors of more standing counts in `crowded_out` and is not stored."""
        with self._lock:
            size = group_size_bytes(group)
            if size > self.max_bytes:
                return False
            self.prune(now)
            if self._per_peer.get(group.origin, 0) >= self.per_peer_max:
                self._evict(self._oldest_of(group.origin))
            while len(self._entries) >= self.max_groups or self._bytes + size > self.max_bytes:
                victim = self._crowded(group.origin, now)
                if victim is None:
                    self.crowded_out += 1
                    return True
                self._evict(victim)
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

    def _crowded(self, newcomer: str, now: float) -> int | None:
        """The entry to evict to make room for a group of `newcomer`'s: the oldest group of the
        authors holding the most for their weight (counting the new group); None when that author
        is `newcomer` alone, holding nothing yet, so the new group is what goes."""
        if not self.standing.earned:  # every author weighs the groups it holds: the oldest goes
            return next(iter(self._entries))
        held = dict(self._per_peer)
        held[newcomer] = held.get(newcomer, 0) + 1
        weights = self.standing.weights(held, now)
        load = {author: held[author] / weights[author] for author in held}
        most = max(load.values())
        crowded = {author for author, share in load.items() if share >= most}
        if crowded == {newcomer} and held[newcomer] == 1:
            return None
        return next(k for k, e in self._entries.items() if e.group.origin in crowded)

    def _oldest_of(self, author: str) -> int:
        return next(k for k, e in self._entries.items() if e.group.origin == author)

    def peers(self) -> list[str]:
        return sorted(self._per_peer)

    def to_json(self) -> dict[str, Any]:
        """What the inbox holds, oldest first, with its counts and its authors' standing: a study's
        run checkpoint keeps it, so that a resumed run chooses from the same groups."""
        with self._lock:  # a copy of what it holds (groups are frozen), dumped after, the lock free
            entries = list(self._entries.items())
            counts = {"authors": list(self._per_peer), "next_id": self._next_id, "evicted": self.evicted}
            crowded_out = self.crowded_out
        return {
            "entries": [[key, e.group.model_dump(mode="json"), e.received_at] for key, e in entries],
            **counts,
            "crowded_out": crowded_out,
            "standing": self.standing.to_json(),
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Take what `to_json` saved into this (empty) inbox, built with the same bounds."""
        with self._lock:
            if self._entries:
                raise ValueError("restore an inbox's saved groups into an empty inbox")
            # authors in the order they came to hold groups: eviction breaks ties by it
            self._per_peer = dict.fromkeys(saved["authors"], 0)
            for key, held, received_at in saved["entries"]:
                group = QuestionGroup.model_validate(held)
                entry = InboxEntry(group, group_size_bytes(group), received_at)
                self._entries[key] = entry
                self._bytes += entry.size_bytes
                self._per_peer[group.origin] += 1
            self._next_id, self.evicted, self.crowded_out = saved["next_id"], saved["evicted"], saved["crowded_out"]
            self.standing.restore(saved["standing"])

    def _evict(self, key: int, count: bool = True) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.size_bytes
        origin = entry.group.origin
        self._per_peer[origin] -= 1
        if not self._per_peer[origin]:
            del self._per_peer[origin]
        self.evicted += int(count)
