"""training/bounded.py, the one bounded map, and protocol/toolkit/recent.py's memory built on it: capacity,
the order things are forgotten in, and that forgetting costs the same however many peers there are."""

import time

import pytest

from sapo.protocol.toolkit.recent import RecentByAuthor
from sapo.training.bounded import BoundedMap


def test_past_its_capacity_the_oldest_makes_way_and_is_handed_back():
    memory: BoundedMap[str, int] = BoundedMap(3)
    assert [memory.put(key, n) for n, key in enumerate("abc")] == [None, None, None]
    assert memory.put("d", 3) == ("a", 0)
    assert list(memory) == ["b", "c", "d"] and len(memory) == 3
    assert "a" not in memory and memory.get("a") is None and memory.get("a", -1) == -1


def test_put_and_touch_make_a_key_the_newest_and_replace_keeps_its_place():
    memory: BoundedMap[str, int] = BoundedMap(3, [("a", 0), ("b", 1), ("c", 2)])
    memory.put("a", 10)  # an existing key moves to the end
    assert list(memory.items()) == [("b", 1), ("c", 2), ("a", 10)]
    memory.touch("b")
    memory.touch("zz")  # not held: nothing happens
    assert list(memory) == ["c", "a", "b"]
    memory.replace("c", 20)
    assert list(memory.items()) == [("c", 20), ("a", 10), ("b", 1)]
    with pytest.raises(KeyError):
        memory.replace("zz", 0)
    assert memory.put("d", 3) == ("c", 20)


def test_oldest_newest_pop_oldest_and_pop():
    memory: BoundedMap[str, int] = BoundedMap(2)
    assert memory.oldest() is None and memory.newest() is None
    with pytest.raises(KeyError):
        memory.pop_oldest()
    memory.put("a", 0)
    memory.put("b", 1)
    assert memory.oldest() == ("a", 0) and memory.newest() == ("b", 1)
    assert memory.pop_oldest() == ("a", 0)
    assert memory.pop("b") == 1 and memory.pop("b") is None and memory.pop("b", 7) == 7
    assert len(memory) == 0


def test_a_saved_copy_longer_than_the_capacity_keeps_its_newest():
    assert list(BoundedMap(2, [("a", 0), ("b", 1), ("c", 2)])) == ["b", "c"]
    with pytest.raises(ValueError, match="capacity of at least 1"):
        BoundedMap(0)


def test_past_the_total_the_author_holding_the_most_forgets_its_oldest():
    memory: RecentByAuthor[None] = RecentByAuthor(per_author=4, total=6)
    for n in range(2):
        memory.put("honest", n, None, stamp=n, now=n)
    for n in range(10):
        memory.put("flooder", n, None, stamp=n, now=n)  # past its own bound it forgets its own
    assert memory.count("flooder") == 4 and memory.count("honest") == 2  # the total: 6
    memory.put("third", 0, None, stamp=0, now=0)
    assert memory.count("flooder") == 3 and memory.count("honest") == 2 and len(memory) == 6
    assert [key for key, _, _ in dict(memory.entries())["flooder"]] == [7, 8, 9]


def test_among_authors_holding_as_many_the_one_that_got_there_first_forgets():
    memory: RecentByAuthor[None] = RecentByAuthor(per_author=2, total=4)
    for author in ("b", "a"):
        for n in range(2):
            memory.put(author, n, None, stamp=0, now=0)
    memory.put("c", 0, None, stamp=0, now=0)
    assert memory.count("b") == 1 and memory.count("a") == 2


def test_forgetting_costs_the_same_however_many_authors_are_held():
    """The most-holding author is found in O(1): with 50,000 authors of one entry each, a scan
    of every author per eviction (as before) would take minutes for these 20,000 puts."""
    authors = 50_000
    memory: RecentByAuthor[None] = RecentByAuthor(per_author=16, total=authors)
    for n in range(authors):
        memory.put(n, 0, None, stamp=0, now=0)
    started = time.perf_counter()
    for n in range(20_000):
        memory.put(authors + n, 0, None, stamp=0, now=0)
    assert time.perf_counter() - started < 2.0
    assert len(memory) == authors


def test_expired_entries_go_first_and_a_restore_keeps_the_order_of_forgetting():
    memory: RecentByAuthor[None] = RecentByAuthor(per_author=8, total=8, ttl=10)
    for n in range(4):
        memory.put("a", n, None, stamp=n, now=n)
    memory.put("a", 4, None, stamp=20, now=20)  # entries stamped before 10 are too old now
    assert [key for key, _, _ in dict(memory.entries())["a"]] == [4]
    copy: RecentByAuthor[None] = RecentByAuthor(per_author=8, total=8, ttl=10)
    copy.restore(memory.entries())
    assert copy.entries() == memory.entries() and len(copy) == 1
