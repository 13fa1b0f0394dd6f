"""A --standing run's end, weighed again under today's `Standing.weights` (issue #42): an OFFLINE
check of the rows a real run left, not a run. It says what each honest node's standing table, as
it stood at the end of the hour, weighs under the current rules, with every pusher placed in
OLDER_RELEASES_PLACE as node/core/exchange.py's `provenance` now places an older release's
group on the topic. What the nodes would have fetched, and when, under the new code is not
re-run: only the weighing.

    .venv/bin/python -m bench.wild_standing_reweigh --out bench/results/standing-swarm [--run ID]

What `Standing.weights` needs of each author, and where it comes from in an honest node's row
(bench/wild_standing.py's `snapshot`: at the end, each author's kind, standing to 4 decimals and
place; every 5 minutes, how many authors of each kind its table knew):

- **dropped**: 0. The bench's nodes run no screen (bench/wild_node.py stores what the intake
  accepts and trains on nothing), so standing is the clock alone.
- **since**, below full standing: the end less standing x ramp (to 0.06 s).
- **since**, at full standing: only a window. An author is first counted at some snapshot, so its
  clock started after the snapshot before (or the run's start) and by that one, and by the end
  less one ramp. Which author of a kind was counted when the rows do not say; this takes the
  windows in clock order, which changes nothing where the authors of a kind are alike (every one
  at full standing, each in a place of its own or all in one place: checked). An author whose window
  straddles two ramps before the end may be recent or not: every split of those is weighed (how
  many of each kind are recent), and the table gives the lowest and the highest honest share.
- **last**: the end (the idle rule, a week, cannot apply within an hour). **place**: as recorded,
  the pushers' replaced by OLDER_RELEASES_PLACE (they are gossip-only keys: every credit of theirs
  came on the topic as an older release's).

Each reconstructed record gives back the standing the row recorded (checked), and the weighing is
wild_standing.py's own `snapshot` over the table. Not weighed again: the inbox's share (the rows
keep only how many authors of each kind an inbox held) and the shares during the run (snapshots
hold counts, not authors).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.text_table import print_rows
from bench.wild_report import load
from bench.wild_standing import AGAINST, snapshot
from bench.wild_standing_report import GOAL, pct
from sapo.sampling.standing import OLDER_RELEASES_PLACE, Standing
from sapo.sampling.trust import TrustSettings


@dataclass(frozen=True)
class Clock:
    """When an author's clock started, as far as the rows say: in [earliest, latest]."""

    kind: str
    place: str
    standing: float
    earliest: float
    latest: float


def clocks(row: dict, t0: float, ramp: float) -> dict[str, Clock]:
    """Each author's clock window in an honest node's table at the end (absolute times)."""
    at = row["standing"]["at"]
    authors = row["standing"]["authors"]  # author -> [kind, standing, place, weight]
    out: dict[str, Clock] = {}
    full: dict[str, list[str]] = {}
    for author, (kind, standing, place, _weight) in authors.items():
        if standing < 1.0:
            since = at - standing * ramp
            out[author] = Clock(kind, place, standing, since, since)
        else:
            full.setdefault(kind, []).append(author)
    snaps = [(t0 + s["t"], s["table"]["authors"]) for s in row["standing_over_time"]]
    for kind, members in full.items():
        members.sort()
        started, given = t0, 0
        for t, counts in snaps:
            if t >= at - ramp:  # every author at full standing had started by then
                break
            counted = min(len(members), max(given, counts.get(kind, 0)))  # none ramping yet
            out |= {a: Clock(kind, authors[a][2], 1.0, started, t) for a in members[given:counted]}
            given, started = counted, t
        out |= {a: Clock(kind, authors[a][2], 1.0, started, at - ramp) for a in members[given:]}
    return out


def recency(clock: Clock, at: float, ramp: float) -> str:
    """Whether an author's clock started within two ramps of `at` ("recent"), before ("before"),
    or the rows cannot say ("either")."""
    if clock.earliest > at - 2 * ramp:
        return "recent"
    return "before" if clock.latest <= at - 2 * ramp else "either"


def alike_within_kinds(row: dict, placed: dict[str, str]) -> bool:
    """Whether the authors at full standing of each kind are interchangeable to the weighing:
    each in a place no other author holds, or all in one place."""
    authors = row["standing"]["authors"]
    holders = Counter(placed.values())
    for kind in {a[0] for a in authors.values()}:
        full = [a for a, rec in authors.items() if rec[0] == kind and rec[1] >= 1.0]
        places = {placed[a] for a in full}
        own = all(holders[placed[a]] == 1 for a in full)
        if full and not (own or len(places) == 1):
            return False
    return True


def reweigh(row: dict, roles: dict[str, str], t0: float, trust: TrustSettings) -> dict[str, tuple[float, float]]:
    """One honest node's honest share over its table at the end, against each kind of attacker:
    (lowest, highest) over every split the rows allow."""
    ramp = trust.standing_ramp_seconds
    at = row["standing"]["at"]
    windows = clocks(row, t0, ramp)
    placed = {a: OLDER_RELEASES_PLACE if c.kind == "pusher" else c.place for a, c in windows.items()}
    if not alike_within_kinds(row, placed):
        raise ValueError(f"node {row['id']}: authors of one kind sit in places that make them unlike")
    boundary = at - 2 * ramp  # a clock that started after this is recent
    straddling: dict[str, list[str]] = {}  # kind -> its authors that may or may not be recent
    for author, clock in sorted(windows.items()):
        if recency(clock, at, ramp) == "either":
            straddling.setdefault(clock.kind, []).append(author)
    shares: dict[str, list[float]] = {against: [] for against in AGAINST}
    # authors of a kind are alike, so which of them are recent does not matter: how many does
    for recent in itertools.product(*(range(len(members) + 1) for members in straddling.values())):
        since = {a: c.latest for a, c in windows.items()} | {
            a: boundary for members, n in zip(straddling.values(), recent, strict=True) for a in members[n:]
        }
        standing = restored(since, placed, at, trust)
        for author, clock in windows.items():  # the reconstruction gives back what the node recorded
            if abs(standing.of(author, at) - clock.standing) > 1e-4:
                raise ValueError(f"node {row['id']}: {author} at {standing.of(author, at)}, recorded {clock.standing}")
        table = snapshot(standing, [], roles, row["peer_id"], now=at)["table"]
        for against in AGAINST:
            if (share := table[against]["honest_share"]) is not None:
                shares[against].append(share)
    return {against: (min(s), max(s)) for against, s in shares.items() if s}


def restored(since: dict[str, float], placed: dict[str, str], at: float, trust: TrustSettings) -> Standing:
    """A `Standing` holding these clocks, each last credited at `at`, nothing dropped."""
    standing = Standing(trust.standing_ramp_seconds, trust.newcomer_share)
    rows = [[author, since[author], at, 1, 0.0, placed[author]] for author in since]
    full = at - trust.standing_ramp_seconds
    standing.restore({"newcomers": [r for r in rows if r[1] > full], "established": [r for r in rows if r[1] <= full]})
    return standing


def report_reweighed(header: dict, rows: list[dict]) -> int:
    plan = header["plan"]
    if not plan.get("standing"):
        print(f"run {header['run']} is no --standing run")
        return 1
    ramp_s = plan["standing"].get("ramp_s")  # None: the node's own, as bench/wild_node.py builds it
    trust = TrustSettings() if ramp_s is None else TrustSettings(standing_ramp_seconds=ramp_s)
    roles = plan["standing"]["roles"]
    honest = [r for r in rows if r["kind"] == "node" and r.get("role") == "honest" and r.get("standing")]
    weighed = {r["id"]: reweigh(r, roles, plan["t0"], trust) for r in honest}
    print(
        f"OFFLINE: run {header['run']}'s {len(honest)} honest nodes' standing tables at the end, "
        f"weighed again by today's Standing.weights, pushers placed in {OLDER_RELEASES_PLACE!r} "
        f"(bench/wild_standing_reweigh.py says what is reconstructed and how); not a run"
    )
    ramp = trust.standing_ramp_seconds
    seen = [Counter((c.kind, recency(c, r["standing"]["at"], ramp)) for c in clocks(r, plan["t0"], ramp).values())
            for r in honest]  # fmt: skip
    print(
        "authors whose clocks started within two ramps of the end, per node (mean): "
        + "; ".join(
            f"{kind} {statistics.fmean(n[kind, 'recent'] for n in seen):.1f}"
            f" (and {statistics.fmean(n[kind, 'either'] for n in seen):.1f} that may have)"
            for kind in ("honest", "pusher", "late")
        )
    )
    table = [["against", "as run: mean", "min", f"nodes >= {GOAL:.0%}",
              "re-weighed, lowest split: mean", "min", f"nodes >= {GOAL:.0%}",
              "highest split: mean", "min", f"nodes >= {GOAL:.0%}"]]  # fmt: skip
    for against in AGAINST:
        cells = [honest_shares([r["standing"]["table"][against]["honest_share"] for r in honest])]
        for end in (0, 1):
            cells.append(honest_shares([w[against][end] for w in weighed.values() if against in w]))
        table.append([against, *itertools.chain.from_iterable(cells)])
    print_rows(table)
    return 0


def honest_shares(shares: list[float | None]) -> list[str]:
    known = [s for s in shares if s is not None]
    if not known:
        return ["-", "-", "0"]
    return [pct(statistics.fmean(known)), pct(min(known)), f"{sum(s >= GOAL for s in known)} of {len(known)}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the run's folder (its rows.jsonl)")
    parser.add_argument("--run", default=None, help="this run (default: the newest)")
    args = parser.parse_args(argv)
    header, rows = load(args.out, args.run)
    return report_reweighed(header, rows)


if __name__ == "__main__":
    raise SystemExit(main())
