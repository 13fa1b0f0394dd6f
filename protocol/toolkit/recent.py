"""A memory of what each author sent lately, bounded per author and in total, in which one
author's traffic can only ever push out that author's own entries.

Why per author: with one shared memory, a peer that sends enough junk of its own flushes
everyone's entries, and then replays of an honest author's older messages look new again (the
attack of issue #29: flush, replay, and the honest author is charged for "repeating" itself).
Here an author over its own bound forgets its own oldest entries; past the total bound the
author holding the most entries forgets its oldest, and an honest author never holds the most
while someone floods.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

from sapo.training.bounded import BoundedMap

V = TypeVar("V")


class RecentByAuthor(Generic[V]):
    """key -> value per author, each entry stamped; entries with a stamp older than `ttl` (when
    given) are forgotten, and so are the oldest past `per_author` or `total`. Past `total`, the
    author holding the most forgets its oldest (among several holding as many, the one that
    reached that many first), found in O(1): the authors are kept by how many entries they hold."""

    def __init__(self, per_author: int, total: int, ttl: float | None = None) -> None:
        if not 0 < per_author <= total:
            raise ValueError(f"need 0 < per_author <= total, got per_author={per_author}, total={total}")
        self.per_author = per_author
        self.total = total
        self.ttl = ttl
        self._authors: dict[Hashable, BoundedMap[Hashable, tuple[V, float]]] = {}
        # entries held -> the authors holding that many, in the order they came to hold it
        self._holding: dict[int, dict[Hashable, None]] = {}
        self._most = 0  # the most any author holds
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def count(self, author: Hashable) -> int:
        return len(self._authors.get(author, ()))

    def get(self, author: Hashable, key: Hashable, default: V | None = None) -> V | None:
        entries = self._authors.get(author)
        entry = entries.get(key) if entries is not None else None
        return default if entry is None else entry[0]

    def contains(self, author: Hashable, key: Hashable) -> bool:
        entries = self._authors.get(author)
        return entries is not None and key in entries

    def put(self, author: Hashable, key: Hashable, value: V, stamp: float, now: float) -> None:
        """Remember `key` for `author`; `stamp` is what `ttl` is measured from, `now` the time."""
        entries = self._authors.get(author)
        if entries is None:
            entries = self._authors[author] = BoundedMap(self.per_author)
        held = len(entries)
        entries.put(key, (value, stamp))  # past `per_author`, the author's own oldest makes way
        self._size += len(entries) - held
        self._recount(author, held, len(entries))
        self._expire(author, now)
        while self._size > self.total:
            self._pop_oldest(next(iter(self._holding[self._most])))

    def entries(self) -> list[tuple[Hashable, list[tuple[Hashable, V, float]]]]:
        """Every author's (key, value, stamp) entries, oldest first, and the authors in the order
        they came: a saved copy keeps what each author forgets first."""
        return [
            (author, [(key, value, stamp) for key, (value, stamp) in entries.items()])
            for author, entries in self._authors.items()
        ]

    def restore(self, saved: list[tuple[Hashable, list[tuple[Hashable, V, float]]]]) -> None:
        """Replace what is remembered by what `entries` gave (of a memory with the same bounds)."""
        self._authors, self._holding, self._most, self._size = {}, {}, 0, 0
        for author, entries in saved:
            memory: BoundedMap[Hashable, tuple[V, float]] = BoundedMap(
                self.per_author, ((key, (value, stamp)) for key, value, stamp in entries)
            )
            if memory:
                self._authors[author] = memory
                self._size += len(memory)
                self._recount(author, 0, len(memory))

    def _expire(self, author: Hashable, now: float) -> None:
        # Entries are in arrival order, stamps nearly so: stop at the first one still young.
        entries = self._authors.get(author)
        while self.ttl is not None and entries and (oldest := entries.oldest()) and now - oldest[1][1] > self.ttl:
            self._pop_oldest(author)

    def _pop_oldest(self, author: Hashable) -> None:
        entries = self._authors[author]
        entries.pop_oldest()
        self._size -= 1
        self._recount(author, len(entries) + 1, len(entries))
        if not entries:
            del self._authors[author]

    def _recount(self, author: Hashable, held: int, holds: int) -> None:
        """`author` held `held` entries and now holds `holds` (a step of one, or a restore)."""
        if held == holds:
            return
        if held:
            authors = self._holding[held]
            del authors[author]
            if not authors:
                del self._holding[held]
        if holds:
            self._holding.setdefault(holds, {})[author] = None
        self._most = max(self._most, holds)
        while self._most and self._most not in self._holding:
            self._most -= 1
