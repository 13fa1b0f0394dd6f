"""Each author's standing with this node: its say in what the node trains on, earned over time.

Identities are free, so a stranger's say in what a node learns cannot follow how many keys it
holds, nor how often it sends: since 0.4.0 a node hears an honest author only when its own
draw picks it (about once an hour among 256 authors at two draws a round). Standing follows
what a key cannot hurry instead, time, and what this node itself checked:

- **Only what the node asked for earns** (`Provenance.asked`): a group fetched from its author,
  an older release's own group on the topic (the only way it has), or, with `--exchange gossip`,
  any author's group there. A group pushed unasked earns nothing.
- **Time since its first verified group**: an author's clock starts at its first group that
  this node asked for, verified and found to carry signal; its standing rises from 0 to 1 over
  `ramp_seconds` from then, however often it is drawn. Sending more often earns nothing more, so
  an author drawn once an hour and one pushing every minute come out alike. A silence of
  `IDLE_SECONDS` (a week) starts its clock again.
- **The screen costs the sender** (sampling/screen.py): each group the screen judged moves the
  author's `dropped` share (the fraction of its winning completions that the screen dropped, the
  latest group weighing `SCREEN_WEIGHT`) and its standing falls with it, to 0 at `DROP_LIMIT`. An
  author whose every group hides poisoned completions behind one clean winner falls to a
  newcomer's weight within a few groups; an honest author's rare stray completion costs it a
  little, for a few groups.

Weights (what the inbox's eviction and the external draw use):
- an author with standing s has weight s, plus its part of the newcomers' budget;
- every author below full standing shares one budget, `newcomer_share` (in units of one
  established author): n fresh keys together weigh as much as one, whatever n is;
- **recent authors**, every author whose clock started within the last two ramps (ramping, or
  established for less than one more ramp), together weigh at most `RECENT_SHARE` of the authors
  established before them, or one established author if there are none: many keys that arrive
  together, whether they ramp now or wait out the ramp, cannot take over. A lone honest newcomer
  is not slowed: it weighs less than one established author, within the cap. An author that
  moves to another place counts as recent for a ramp, its standing kept, so keys aged together
  in a shared place (the older releases', one /16) arrive as a cohort when they leave it;
- **every author has a place**, the network group its connection comes from (`Provenance.place`:
  its IP's /16 or /32, or its relay's for a relayed author), and authors with none known share
  one "unknown" place. A place weighs what its best author weighs, shared among its authors in
  proportion to their own weights, so keys minted on one machine, one provider's block or behind
  one relay add nothing to each other, and an honest author keeps its weight beside them. The
  recent cap weighs authors after their places, so keys that share a place count once among the
  authors established before a cohort.
- **older releases share one place** (`OLDER_RELEASES_PLACE`), in fetch mode: a group an older
  release puts on the topic is taken by right (it cannot be fetched), and anyone can claim to be
  one (identify that leaves out `/sapo/groups/1`), so all the keys that do weigh together what
  their best author weighs: one established author at most. The cost falls on honest older releases during an
  upgrade: together they weigh one established author until each is upgraded and fetched, when
  its own network group places it again. That is the price of taking unasked groups at all; a
  swarm mid-upgrade still trains on them, a little less.

So when every author is new (a swarm starting together) all weigh alike; a Sybil that adds keys
only splits the newcomers' budget finer.

The records are bounded (`max_authors`) by sampling/standing_table.py: fresh keys churn among
newcomers and never evict an established author. They are part of the node's memory of its
peers, saved in its checkpoints and restored after a restart (node/core/memory.py).

With `mode="off"` (`--standing off`) nothing is earned and every group weighs alike: an author's
weight is the number of groups it holds, so the inbox evicts the oldest group and the draw is
uniform over groups, as before standing existed.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sapo.sampling.standing_table import Record, StandingTable

# Default time from an author's first verified group to full standing.
RAMP_SECONDS = 600.0
# An author silent this long (no group that earned) starts again: a key bought or found long
# after its owner left is a newcomer, and an author that left frees its record.
IDLE_SECONDS = 7 * 86400.0
# How much the latest screened group moves an author's dropped share, and the share at which its
# standing is gone: a group with one clean winner and one poisoned (half dropped) takes an
# established author to 0 in 8 groups, one with three poisoned in 4; an honest author whose
# screened groups lose 2 % of their completions keeps 95 %, and one refused group costs it half
# of its standing, regained over its next groups (0.2 -> 0.04 after 7 clean ones).
SCREEN_WEIGHT = 0.2
DROP_LIMIT = 0.4
# What the authors whose clocks started within the last two ramps may weigh together, as a share of
# the authors established before them. 0.2 holds such a cohort, however many keys it has, to
# 1/6 of the draw (0.2 / 1.2): against it honest authors keep 83 %, above issue #42's 80 % with
# room for the older releases' place (one author) and the newcomers' budget (0.1) beside it
# (31 honest authors: 31 / (31 + 1 + 0.2 x 32 + 0.1) = 80.5 %). The cap is never below one
# established author, so where those established before weigh less than 5 (a small swarm, or an
# inbox that holds few authors) a cohort of any size weighs one: 1 / (h + 1) against h authors.
RECENT_SHARE = 0.2
MAX_AUTHORS = 4096
UNKNOWN_PLACE = "unknown"  # every author whose network group is not known: one place
# Every author whose groups came on the topic as an older release's (fetch mode): one place, as
# anyone can claim to be one (node/core/exchange.py's `provenance`).
OLDER_RELEASES_PLACE = "older releases"


@dataclass(frozen=True)
class Provenance:
    """How a group reached this node, as standing weighs it: whether this node asked for it (a
    group fetched from its author, an older release's own group on the topic, every group with
    `--exchange gossip` or from a study's hub), and where its author is placed: its connection's
    network group, a relayed author's relay's, OLDER_RELEASES_PLACE for an older release's group
    on the topic in fetch mode, or None (not known)."""

    asked: bool = True
    place: str | None = None


ASKED = Provenance()  # asked for, its author's place not known (a study's hub, a test)
PUSHED = Provenance(asked=False)


class Standing:
    def __init__(
        self,
        ramp_seconds: float = RAMP_SECONDS,
        newcomer_share: float = 0.1,
        max_authors: int = MAX_AUTHORS,
        mode: Literal["earned", "off"] = "earned",
    ):
        if ramp_seconds <= 0 or newcomer_share <= 0 or max_authors < 2:
            raise ValueError("standing needs a positive ramp and newcomer share, and room for two authors")
        self.earned = mode == "earned"
        self.ramp_seconds = ramp_seconds
        self.newcomer_share = newcomer_share
        self.max_authors = max_authors
        self._table = StandingTable(max_authors, ramp_seconds, IDLE_SECONDS)
        # Credits arrive from the network's worker thread while the round reads weights.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._table)

    def credit(self, author: str, now: float, provenance: Provenance = ASKED) -> None:
        """A group of `author`'s was verified and carried signal, at `now`, and came as
        `provenance` says: it earns only if this node asked for it."""
        if not self.earned or not provenance.asked:
            return
        with self._lock:
            record = self._table.credited(author, now)
            if provenance.place is not None and provenance.place != record.place:
                # A place once known stays until another is seen. A move counts the author among
                # the recent ones for a ramp (its standing kept): keys aged together in a shared
                # place (the older releases', one /16, none known) that move to places of their
                # own arrive as a cohort, and the recent cap weighs them as one.
                if record.place is not None or record.groups > 1:
                    record.since = max(record.since, now - self.ramp_seconds)
                record.place = provenance.place

    def screened(self, author: str, dropped_share: float) -> None:
        """The screen judged a group of `author`'s and dropped `dropped_share` of its winning
        completions (1.0: the group was refused)."""
        if not self.earned:
            return
        with self._lock:
            record = self._table.get(author)
            if record is not None:
                share = min(1.0, max(0.0, dropped_share))
                record.dropped = (1.0 - SCREEN_WEIGHT) * record.dropped + SCREEN_WEIGHT * share

    def of(self, author: str, now: float) -> float:
        """Standing in [0, 1] at `now`."""
        with self._lock:
            record = self._table.get(author)
        return self._standing(record, now)

    def _standing(self, record: Record | None, now: float) -> float:
        if record is None or now - record.last > IDLE_SECONDS:
            return 0.0
        clock = min(1.0, max(0.0, now - record.since) / self.ramp_seconds)
        return clock * max(0.0, 1.0 - record.dropped / DROP_LIMIT)

    def _recent(self, record: Record | None, now: float) -> bool | None:
        """Whether an author's clock started within the last two ramps (True: it ramps, or became
        established within the last ramp), before that (False: established before them), or it
        has no clock running (None: never credited, or silent for IDLE_SECONDS)."""
        if record is None or now - record.last > IDLE_SECONDS:
            return None
        return now - record.since < 2 * self.ramp_seconds

    def weights(self, held: Mapping[str, int] | Iterable[str], now: float) -> dict[str, float]:
        """Each author's weight at `now` among the authors of `held` (author -> groups it holds,
        or one author per group): its standing, plus its share of the newcomers' budget, within
        its place, the recent authors held to their share; with standing off, the groups it
        holds."""
        counts = Counter(held) if not isinstance(held, Mapping) else held
        if not self.earned:
            return {author: float(count) for author, count in counts.items()}
        with self._lock:  # read at once: credits from the network's thread may change a record meanwhile
            known = {a: self._table.get(a) for a in counts}
            standing = {a: self._standing(r, now) for a, r in known.items()}
            recent = {a: self._recent(r, now) for a, r in known.items()}
            places = {a: r.place if r is not None else None for a, r in known.items()}
        return self._recent_capped(_within_places(self._alone(standing), places), recent)

    def _alone(self, standing: Mapping[str, float]) -> dict[str, float]:
        """Each author's standing, plus for those below full standing an equal part of the
        newcomers' budget."""
        newcomers = sum(1 for s in standing.values() if s < 1.0)
        share = self.newcomer_share / newcomers if newcomers else 0.0
        return {a: s + (share * (1.0 - s) if s < 1.0 else 0.0) for a, s in standing.items()}

    def _recent_capped(self, weights: dict[str, float], recent: Mapping[str, bool | None]) -> dict[str, float]:
        """`weights`, the recent authors scaled down together to at most RECENT_SHARE of the
        authors established before them (or one established author). Weighed after the places,
        so keys that share one (the older releases', a machine's) count once in "before"; scaling
        a place's recent authors down never makes it weigh more than its best author."""
        before = sum(weights[a] for a, is_recent in recent.items() if is_recent is False)
        arrived = sum(weights[a] for a, is_recent in recent.items() if is_recent)
        cap = max(1.0, RECENT_SHARE * before)
        if arrived <= cap:
            return weights
        return weights | {a: weights[a] * cap / arrived for a, is_recent in recent.items() if is_recent}

    def draw_weights(self, authors: Iterable[str], now: float) -> dict[str, float] | None:
        """What the external draw weighs each author by at `now` (sampling/strategies.py); None
        with standing off, the samplers' own draw where every group weighs alike."""
        return self.weights(authors, now) if self.earned else None

    def to_json(self) -> dict[str, Any]:
        """Each author's record, newcomers (oldest clock first) and established authors (least
        recently credited first): [author, since, last, groups, dropped, place]."""
        with self._lock:
            newcomers, established = self._table.records()
            return {
                "v": 2,
                "newcomers": [_row(author, r) for author, r in newcomers],
                "established": [_row(author, r) for author, r in established],
            }

    def restore(self, saved: dict[str, Any] | list[list] | None) -> None:
        """Take the records `to_json` saved, or a list of [author, earned, last, place] as releases
        to 0.4.x saved them: an author that had earned e seconds by its last group `last` is taken
        to have started its clock at last - e, so one that had full standing keeps it."""
        if not saved:  # None: saved with standing off, before 0.4.0
            saved = {"newcomers": [], "established": []}
        if isinstance(saved, list):
            old = [
                (author, Record(last - earned, last, place=place), earned)
                for author, earned, last, place in saved
                if last is not None
            ]
            newcomers = [(a, r) for a, r, earned in old if earned < self.ramp_seconds]
            established = [(a, r) for a, r, earned in old if earned >= self.ramp_seconds]
        else:
            newcomers = [(row[0], Record(*row[1:])) for row in saved["newcomers"]]
            established = [(row[0], Record(*row[1:])) for row in saved["established"]]
        with self._lock:
            self._table.load(newcomers, established)


def _within_places(alone: Mapping[str, float], places: Mapping[str, str | None]) -> dict[str, float]:
    """A place weighs what its best author weighs alone, shared among its authors in proportion to
    their own weights; authors with no place known share UNKNOWN_PLACE."""
    members: dict[str, list[str]] = {}
    for author, place in places.items():
        members.setdefault(place if place is not None else UNKNOWN_PLACE, []).append(author)
    weights: dict[str, float] = {}
    for authors in members.values():
        total = sum(alone[a] for a in authors)
        best = max(alone[a] for a in authors)
        weights |= {a: best * alone[a] / total if total > 0 else 0.0 for a in authors}
    return weights


def _row(author: str, record: Record) -> list:
    return [author, record.since, record.last, record.groups, record.dropped, record.place]
