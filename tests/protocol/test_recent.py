"""protocol/toolkit/recent.py: a saved memory restores to the same entries, in the same order."""

from sapo.protocol.toolkit.recent import RecentByAuthor


def test_entries_restore_to_the_same_memory():
    memory: RecentByAuthor[bytes | None] = RecentByAuthor(2, 3)
    for author, key, stamp in [("a", b"1", 1.0), ("b", b"2", 2.0), ("a", b"3", 3.0), ("a", b"4", 4.0)]:
        memory.put(author, key, None if author == "a" else b"v", stamp=stamp, now=stamp)
    copy: RecentByAuthor[bytes | None] = RecentByAuthor(2, 3)
    copy.restore(memory.entries())
    assert (
        copy.entries()
        == memory.entries()
        == [("a", [(b"3", None, 3.0), (b"4", None, 4.0)]), ("b", [(b"2", b"v", 2.0)])]
    )
    assert len(copy) == 3
    copy.put("b", b"5", b"w", stamp=5.0, now=5.0)  # past the total: the author holding most forgets first
    assert copy.entries() == [("a", [(b"4", None, 4.0)]), ("b", [(b"2", b"v", 2.0), (b"5", b"w", 5.0)])]
