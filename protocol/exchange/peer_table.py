"""Discovery's table of signed peer records, which no one source can fill (issue #41).

A fetch draws its authors from this table, so whoever fills it owns the draw. Identities are
free, connections nearly so, but addresses in many networks are not: every record is held in
three buckets, and each bucket has a cap.

- its *source*, the peer whose stream carried it (a peer's own record is its own source): at
  most `per_source` records, max(8, max_peers / 16);
- its source's *network group*, the IPv4 /16 or IPv6 /32 that source's connection came from
  (toolkit/hosts.py's `network_group`; one "relayed" group for every source behind a relay):
  at most `per_group`, max(8, max_peers / 8), however many connections the group opens;
- the record's own network group, that of its first direct address (of its relay's, for a
  relay-only record): at most `per_group` too, so strangers cannot crowd one network's records.

A full bucket makes way for a newcomer, and so does the table, from its fullest source group:
third-party records before first-hand ones (told us by their owner itself), and among the
bucket's 32 oldest third-party records the one whose source group and then source hold most,
then the oldest learned. No insert looks at more than that, however large the table.
A first-hand record never makes way for a third-party one: the newcomer is refused instead.
Records on our host or LAN (the "local" group: every peer of a one-machine swarm or a test
network) have no group cap, only the cap per source: nothing tells such peers apart as
operators, and only a source that is itself local may name them (peer_records.py's `reach`).

A record told by another source moves to it when that source's group holds fewer records, so
a flood of strangers who repeat honest records first cannot keep them in their own buckets,
where their flood would push them out. A same-seq replay never changes the addresses held.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from itertools import islice
from typing import Any, Generic, TypeVar

from libp2p.peer.id import ID

from sapo.protocol.toolkit.hosts import network_group
from sapo.protocol.wire.peer_records import RECORDS_PER_RESPONSE, KnownPeer, substitute

# Failed dials back off 2, 4, 8... s (at most a minute); after this many the record is dropped.
MAX_DIAL_FAILURES = 4
# Groups no group cap counts: our host, LAN and container networks (see the module docstring).
UNCAPPED_GROUPS = frozenset({"local"})
# The oldest third-party records of a bucket weighed against each other when one must make way:
# a bucket of the uncapped group can hold the whole table, and an insert must not scan it.
WEIGHED = 32

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Source:
    """Who told us of a record: the peer whose stream carried it, and the network group its
    connection came from (toolkit/hosts.py's `reached_group`)."""

    peer: ID
    group: str


class Buckets(Generic[K]):
    """Peer ids by key, each bucket's third-party and first-hand members apart, oldest first,
    with its fullest bucket found in O(1): sizes move by one, so a count of buckets per size
    finds the largest."""

    def __init__(self) -> None:
        self._members: dict[K, tuple[dict[ID, None], dict[ID, None]]] = {}  # (third-party, first-hand)
        self._by_size: dict[int, dict[K, None]] = {}  # size -> buckets of that size, longest there first
        self.largest = 0

    def size(self, key: K) -> int:
        members = self._members.get(key)
        return len(members[0]) + len(members[1]) if members is not None else 0

    def oldest(self, key: K, limit: int, but: ID | None = None) -> list[ID]:
        """Up to `limit` of the bucket's oldest third-party members (not `but`), else its oldest
        first-hand one: the candidates to make way, weighed by `PeerTable._victim`."""
        third, first = self._members.get(key, ({}, {}))
        found = list(islice((p for p in third if p != but), limit))
        return found or list(islice((p for p in first if p != but), 1))

    def fullest(self) -> K | None:
        return next(iter(self._by_size[self.largest])) if self.largest else None

    def add(self, key: K, peer: ID, first_hand: bool) -> None:
        size = self.size(key)
        self._resize(key, size, size + 1)
        self._members.setdefault(key, ({}, {}))[first_hand][peer] = None

    def discard(self, key: K, peer: ID) -> None:
        members = self._members.get(key)
        if members is None or not (peer in members[0] or peer in members[1]):
            return
        members[peer in members[1]].pop(peer)
        size = len(members[0]) + len(members[1])
        self._resize(key, size + 1, size)
        if not size:
            del self._members[key]

    def touch(self, key: K, peer: ID) -> None:
        for members in self._members.get(key, ()):
            if peer in members:
                members[peer] = members.pop(peer)

    def _resize(self, key: K, old: int, new: int) -> None:
        if old:
            sized = self._by_size[old]
            del sized[key]
            if not sized:
                del self._by_size[old]
        if new:
            self._by_size.setdefault(new, {})[key] = None
        if new > self.largest:
            self.largest = new
        elif old == self.largest and old not in self._by_size:
            self.largest = new  # it was the only one that large


class PeerTable:
    """At most `max_peers` checked records, in buckets no source, network or network of
    sources can fill beyond its cap (the module docstring)."""

    def __init__(self, max_peers: int, *, per_source: int | None = None, per_group: int | None = None) -> None:
        self.max_peers = max_peers
        self.per_source = per_source or max(8, max_peers // 16)
        self.per_group = per_group or max(8, max_peers // 8)
        self._peers: dict[ID, KnownPeer] = {}
        self._by_source: Buckets[ID | None] = Buckets()
        self._by_source_group: Buckets[str] = Buckets()
        self._by_group: Buckets[str] = Buckets()

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, peer_id: ID) -> bool:
        return peer_id in self._peers

    def get(self, peer_id: ID) -> KnownPeer | None:
        return self._peers.get(peer_id)

    def held_by(self, source: ID) -> int:
        """How many records `source` holds in the table."""
        return self._by_source.size(source)

    def add(self, entry: KnownPeer, source: Source | None = None) -> bool:
        """Store or refresh the record `source` told us of (None: its owner, in the record's own
        group); True if the peer was not known before. An older record is ignored."""
        entry.group = record_group(entry)
        source = source or Source(entry.peer_id, entry.group)
        held = self._peers.get(entry.peer_id)
        if held is not None:
            self._refresh(held, entry, source)
            return False
        entry.source, entry.source_group = source.peer, source.group
        if not self._make_room(entry):
            return False
        self._peers[entry.peer_id] = entry
        self._place(entry)
        return True

    def remove(self, peer_id: ID) -> None:
        entry = self._peers.pop(peer_id, None)
        if entry is not None:
            self._unplace(entry)

    def addrs_of(self, peer_id: ID) -> list:
        entry = self._peers.get(peer_id)
        return entry.dial_addrs if entry is not None else []

    def records_of(self, peers: list[ID]) -> list[tuple[bytes, str | None]]:
        """Records (with their observed IPs) of those `peers` we hold, at most one response's worth."""
        held = [self._peers[p] for p in peers if p in self._peers]
        chosen = random.sample(held, min(len(held), RECORDS_PER_RESPONSE))
        return [(entry.envelope, entry.observed_ip) for entry in chosen]

    def records_to_share(self, connected: list[ID]) -> list[tuple[bytes, str | None]]:
        """One response's worth: about half of it records of peers we are connected to (alive a
        moment ago), the rest drawn from the whole table. Only connected peers' records kept
        swarms that bootstrapped through different seeds apart (docs/bench/scale.md: three
        clusters at 64 nodes), and a fetcher's draw over one cluster; a stale record costs a
        failed dial, and is dropped after a few."""
        linked = self.records_of(connected)[: RECORDS_PER_RESPONSE // 2 + 1]
        skip = set(connected)
        others = [e for e in self._peers.values() if e.peer_id not in skip]
        rest = random.sample(others, min(len(others), RECORDS_PER_RESPONSE - len(linked)))
        return linked + [(entry.envelope, entry.observed_ip) for entry in rest]

    def entries(self) -> list[KnownPeer]:
        return list(self._peers.values())

    def candidates(self, now: float, skip: Callable[[ID], bool]) -> list[KnownPeer]:
        """Records not waiting out a failed dial, but those `skip` says."""
        return [e for e in self._peers.values() if e.next_dial_at <= now and not skip(e.peer_id)]

    def dial_failed(self, peer_id: ID, now: float) -> None:
        """A dial of `peer_id` failed (ours, or a fetch's): back off, and after MAX_DIAL_FAILURES drop it."""
        entry = self._peers.get(peer_id)
        if entry is None:
            return
        entry.failures += 1
        if entry.failures >= MAX_DIAL_FAILURES:
            self.remove(peer_id)
        else:
            entry.next_dial_at = now + min(60.0, 2.0**entry.failures)

    def dial_ok(self, peer_id: ID) -> None:
        entry = self._peers.get(peer_id)
        if entry is not None:
            entry.failures, entry.next_dial_at = 0, 0.0

    # --- keeping the buckets ----------------------------------------------------------------------

    def _refresh(self, held: KnownPeer, entry: KnownPeer, source: Source) -> None:
        """A record we hold, told again. Its owner's word (first-hand) wins: it becomes the
        record's source and its connection's IP fills the 0.0.0.0; a third party's changes no
        address but a newer sequence number's (the owner signed those), and may move the record
        to a less crowded source (the module docstring)."""
        if entry.seq < held.seq:
            return
        placed = (held.source, held.source_group, held.group, held.first_hand)
        if entry.first_hand:
            held.first_hand, held.observed_ip, held.hinted = True, entry.observed_ip, []
            held.source, held.source_group = source.peer, source.group
        if entry.seq > held.seq or entry.first_hand:
            held.seq, held.envelope, held.listening = entry.seq, entry.envelope, entry.listening
            if held.first_hand:  # the IP its owner's connection came from fills its 0.0.0.0 (within reach: its own)
                own = substitute(held.peer_id, entry.listening, held.observed_ip, "loopback")
                held.addrs, held.hinted = entry.addrs + [a for a in own if a not in entry.addrs], []
            elif held.observed_ip is not None:  # the hint we took first, on the newer record's ports
                held.addrs = entry.addrs
                held.hinted = substitute(held.peer_id, entry.listening, held.observed_ip, "loopback")
            else:
                held.addrs, held.hinted, held.observed_ip = entry.addrs, entry.hinted, entry.observed_ip
            held.group = record_group(held)
        elif not held.first_hand and self._less_crowded(source, held):
            held.source, held.source_group = source.peer, source.group
        if placed == (held.source, held.source_group, held.group, held.first_hand):
            self._by_source.touch(held.source, held.peer_id)  # learned again: the newest of its buckets
            self._by_source_group.touch(held.source_group, held.peer_id)
            self._by_group.touch(held.group, held.peer_id)
            return
        self._unplace(held, placed)
        self._place(held)
        self._trim(held)

    def _less_crowded(self, source: Source, held: KnownPeer) -> bool:
        if source.peer == held.source or self._by_source.size(source.peer) >= self.per_source:
            return False
        if self._by_source_group.size(source.group) >= self._cap(source.group):
            return False
        return self._by_source_group.size(source.group) + 1 < self._by_source_group.size(held.source_group)

    def _make_room(self, entry: KnownPeer) -> bool:
        """Evict what the caps and the table's bound ask for before `entry` comes in; False (and
        nothing more evicted) if the one that would go is first-hand and `entry` is not."""
        full: list[tuple[Buckets[Any], Hashable, int]] = [
            (self._by_source, entry.source, self.per_source),
            (self._by_source_group, entry.source_group, self._cap(entry.source_group)),
            (self._by_group, entry.group, self._cap(entry.group)),
        ]
        for buckets, key, cap in full:
            if buckets.size(key) >= cap and not self._evict_from(buckets, key, entry):
                return False
        if len(self._peers) >= self.max_peers:
            return self._evict_from(self._by_source_group, self._by_source_group.fullest(), entry)
        return True

    def _evict_from(self, buckets: Buckets[Any], key: Hashable, entry: KnownPeer) -> bool:
        victim = self._victim(buckets.oldest(key, WEIGHED))
        if victim is None or (victim.first_hand and not entry.first_hand):
            return False
        self.remove(victim.peer_id)
        return True

    def _victim(self, peers: list[ID]) -> KnownPeer | None:
        """Third-party before first-hand; then the fullest source group, the fullest source; then the oldest."""
        best, best_rank = None, None
        for peer in peers:
            entry = self._peers[peer]
            rank = (
                entry.first_hand,
                -self._by_source_group.size(entry.source_group),
                -self._by_source.size(entry.source),
            )
            if best_rank is None or rank < best_rank:
                best, best_rank = entry, rank
        return best

    def _trim(self, entry: KnownPeer) -> None:
        """After a move: evict from any bucket `entry` has pushed past its cap (never `entry`)."""
        caps: list[tuple[Buckets[Any], Hashable, int]] = [
            (self._by_source, entry.source, self.per_source),
            (self._by_source_group, entry.source_group, self._cap(entry.source_group)),
            (self._by_group, entry.group, self._cap(entry.group)),
        ]
        for buckets, key, cap in caps:
            while buckets.size(key) > cap:
                victim = self._victim(buckets.oldest(key, WEIGHED, but=entry.peer_id))
                if victim is None:
                    break
                self.remove(victim.peer_id)

    def _cap(self, group: str) -> int:
        return self.max_peers if group in UNCAPPED_GROUPS else self.per_group

    def _place(self, entry: KnownPeer) -> None:
        self._by_source.add(entry.source, entry.peer_id, entry.first_hand)
        self._by_source_group.add(entry.source_group, entry.peer_id, entry.first_hand)
        self._by_group.add(entry.group, entry.peer_id, entry.first_hand)

    def _unplace(self, entry: KnownPeer, placed: tuple[ID | None, str, str, bool] | None = None) -> None:
        source, source_group, group, _ = placed or (entry.source, entry.source_group, entry.group, entry.first_hand)
        self._by_source.discard(source, entry.peer_id)
        self._by_source_group.discard(source_group, entry.peer_id)
        self._by_group.discard(group, entry.peer_id)


def record_group(entry: KnownPeer) -> str:
    """The network group of a record's first direct address, else of its first relay's (every
    address check_record keeps starts /ip4|ip6/<ip>/tcp/<port>)."""
    texts = [str(address) for address in entry.dial_addrs]
    direct = [text for text in texts if "/p2p-circuit" not in text]
    for text in direct[:1] or texts[:1]:
        return network_group(text.split("/")[2])
    return "unknown"
