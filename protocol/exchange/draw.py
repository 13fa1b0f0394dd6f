"""The order in which a fetch asks its authors: a network group first, then an author in it.

Identities are free, addresses in many networks are not. A draw uniform over identities gives
whoever mints most keys most of the draw (issue #41: with 100 connections, 93 % of it); a draw
that takes groups in turn gives an operator one place per round for each network group it
really holds. An author's group is where we know it to be: the IPv4 /16 or IPv6 /32 of its
connection to us, or, for one known only from discovery, that of the source that told us of it
(protocol/exchange/peer_table.py), so addresses a stranger signs for its own keys do not count.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from itertools import chain, zip_longest
from typing import Any, TypeVar

T = TypeVar("T")
_GAP = object()


def draw_order(
    items: Iterable[T], group_of: Callable[[T], str], shuffle: Callable[[list[Any]], None] = random.shuffle
) -> list[T]:
    """`items` in draw order: the groups shuffled, the members of each shuffled, then round
    after round one member of each group, in the groups' order, until all are drawn."""
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(group_of(item), []).append(item)
    members = list(groups.values())
    for group in members:
        shuffle(group)
    shuffle(members)
    rounds = zip_longest(*members, fillvalue=_GAP)
    return [item for item in chain.from_iterable(rounds) if item is not _GAP]  # type: ignore[misc]
