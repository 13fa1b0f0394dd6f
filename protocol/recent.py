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

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class RecentByAuthor(Generic[V]):
    """key -> value per author, each entry stamped; entries with a stamp older than `ttl` (when
    given) are forgotten, and so are the oldest past `per_author` or `total`."""

    def __init__(self, per_author: int, total: int, ttl: float | None = None) -> None:
        if not 0 < per_author <= total:
            raise ValueError(f"need 0 < per_author <= total, got per_author={per_author}, total={total}")
        self.per_author = per_author
        self.total = total
        self.ttl = ttl
        self._authors: dict[Hashable, OrderedDict[Hashable, tuple[V, float]]] = {}
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
        return key in self._authors.get(author, {})

    def put(self, author: Hashable, key: Hashable, value: V, stamp: float, now: float) -> None:
        """Remember `key` for `author`; `stamp` is what `ttl` is measured from, `now` the time."""
        entries = self._authors.setdefault(author, OrderedDict())
        if key in entries:
            self._size -= 1
        entries[key] = (value, stamp)
        entries.move_to_end(key)
        self._size += 1
        self._expire(author, now)
        while len(entries) > self.per_author:
            self._pop_oldest(author)
        while self._size > self.total:
            self._pop_oldest(max(self._authors, key=lambda a: len(self._authors[a])))

    def entries(self) -> list[tuple[Hashable, list[tuple[Hashable, V, float]]]]:
        """Every author's (key, value, stamp) entries, oldest first, and the authors in the order
        they came: both decide what is forgotten first, so a saved copy keeps them."""
        return [
            (author, [(key, value, stamp) for key, (value, stamp) in entries.items()])
            for author, entries in self._authors.items()
        ]

    def restore(self, saved: list[tuple[Hashable, list[tuple[Hashable, V, float]]]]) -> None:
        """Replace what is remembered by what `entries` gave (of a memory with the same bounds)."""
        self._authors = {
            author: OrderedDict((key, (value, stamp)) for key, value, stamp in entries) for author, entries in saved
        }
        self._size = sum(len(entries) for entries in self._authors.values())

    def _expire(self, author: Hashable, now: float) -> None:
        # Entries are in arrival order, stamps nearly so: stop at the first one still young.
        entries = self._authors[author]
        while self.ttl is not None and entries and now - next(iter(entries.values()))[1] > self.ttl:
            self._pop_oldest(author)

    def _pop_oldest(self, author: Hashable) -> None:
        entries = self._authors[author]
        entries.popitem(last=False)
        self._size -= 1
        if not entries:
            del self._authors[author]
