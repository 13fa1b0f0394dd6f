"""The one bounded map: every memory keyed by what peers send (authors, peer ids, digests) is one.

Identities are free, so a memory with a key per peer grows with whatever a stranger mints,
unless it has a bound and forgets something when it is reached. `BoundedMap` holds at most
`capacity` entries in the order they were put (`put` also moves an existing key to the end;
`touch` moves one on use) and, past the bound, forgets the oldest, in O(1).

It lives in training/, the bottom layer, because the layers above it all keep such memories:
protocol/ (peer tables, fetch bookkeeping, duplicate memories), sampling/ (authors' standing)
and node/ (the intake's budgets and waiting log-probs).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator
from typing import Generic, TypeVar, overload

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")


class BoundedMap(Generic[K, V]):
    """key -> value, at most `capacity` of them, oldest first; `put` past the bound forgets the
    oldest and hands it back. `items` (e.g. a saved copy's) are put in order."""

    def __init__(self, capacity: int, items: Iterable[tuple[K, V]] = ()) -> None:
        if capacity < 1:
            raise ValueError(f"a bounded map needs a capacity of at least 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        for key, value in items:
            self.put(key, value)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def __getitem__(self, key: K) -> V:
        return self._entries[key]

    @overload
    def get(self, key: K) -> V | None: ...

    @overload
    def get(self, key: K, default: D) -> V | D: ...

    def get(self, key: K, default: object = None) -> object:
        return self._entries.get(key, default)

    def items(self) -> Iterator[tuple[K, V]]:
        return iter(self._entries.items())

    def values(self) -> Iterator[V]:
        return iter(self._entries.values())

    def put(self, key: K, value: V) -> tuple[K, V] | None:
        """Hold `key` as the newest entry (an existing one moves to the end); the oldest entry,
        if it had to make way."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self.capacity:
            return self._entries.popitem(last=False)
        return None

    def replace(self, key: K, value: V) -> None:
        """A new value for a key already held, where it stands (KeyError if it is not held)."""
        if key not in self._entries:
            raise KeyError(key)
        self._entries[key] = value

    def touch(self, key: K) -> None:
        """`key` was used: it becomes the newest (nothing happens if it is not held)."""
        if key in self._entries:
            self._entries.move_to_end(key)

    @overload
    def pop(self, key: K) -> V | None: ...

    @overload
    def pop(self, key: K, default: D) -> V | D: ...

    def pop(self, key: K, default: object = None) -> object:
        return self._entries.pop(key, default)

    def oldest(self) -> tuple[K, V] | None:
        """The entry that would make way next, or None when empty."""
        if not self._entries:
            return None
        key = next(iter(self._entries))
        return key, self._entries[key]

    def newest(self) -> tuple[K, V] | None:
        """The entry put or touched last, or None when empty."""
        if not self._entries:
            return None
        key = next(reversed(self._entries))
        return key, self._entries[key]

    def pop_oldest(self) -> tuple[K, V]:
        """Forget the oldest entry and hand it back (KeyError when empty)."""
        if not self._entries:
            raise KeyError("pop_oldest from an empty bounded map")
        return self._entries.popitem(last=False)
