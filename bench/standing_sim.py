"""Standing under fetching (issue #42), simulated: honest authors' share of a node's draw weight
after an hour, with main's rule and with this release's, against attackers.

The node is the real `Standing` (sampling/standing.py) driven with simulated time; "before" is
main 49a8773's rule (`MainRule` below, its credit and weights copied for this comparison only:
a credited group adds the gap since the author's last one, at most 60 s, full standing at 600 s).

Each 26 s round the node draws 2 authors uniformly from those it knows (protocol/exchange/
group_fetch.py's draw) and asks each for a group: a verified group with signal that it asked
for. 256 honest authors from the start, each in a /16 of its own, so each is drawn about once
an hour. The attackers, every key in a /16 of its own (the worst case for places):

- pushers: 20 keys push one valid group a minute on the topic from the start. As 0.4.0 keys
  their pushes are refused before any check today (`unasked`) and earn nothing; main's rule
  counted them as main at 896c779 took them. "pushers, as older releases": the same keys
  claiming to be releases before 0.4.0, whose groups come on the topic by right and reach the
  intake (posing takes a connection of 30 s per key); they earn by time like anyone, and this
  release places them all in one place, the older releases' (main: each in its /16).
- late: 20 keys in the draw like everyone else, arriving within the last 10 minutes.
- patient: 200 keys posing as older releases push a group a minute for 10 minutes, from 20 to
  10 minutes before the end (they wait out the ramp together), then stop.

Printed: per scenario and rule, honest authors' share of the draw weight over every author the
node knows (`weights` at the end of the hour), the mean over seeds and the lowest, and how many
honest authors stand at 1.0. `--out DIR` also writes each seed's row (rows.csv), from which
`--report DIR` rebuilds the table.

    python -m bench.standing_sim                 # 20 seeds, about a minute
    python -m bench.standing_sim --smoke         # 2 seeds
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
from collections import defaultdict
from pathlib import Path

from bench.text_table import print_rows
from sapo.sampling.standing import OLDER_RELEASES_PLACE, Provenance, Standing

HONEST = 256
ROUND_SECONDS = 26.0
HOUR = 3600.0
DRAWS = 2
SCENARIOS = ("pushers", "pushers, as older releases", "late", "patient")
POSING_AS_OLDER = ("pushers, as older releases", "patient")  # their groups come on the topic by right
FIELDS = ["scenario", "rule", "seed", "honest_share", "honest_weight", "attacker_weight", "honest_full"]


class MainRule:
    """main 49a8773's standing, for the "before" column only: every group the intake accepted
    credits its author the gap since its last one, at most 60 s; 600 s is full standing; authors
    below it share a newcomers' budget of 0.1; a place weighs its best author, split evenly."""

    def __init__(self) -> None:
        self.earned: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.place: dict[str, str] = {}

    def credit(self, author: str, now: float, provenance: Provenance) -> None:
        if author in self.last:
            self.earned[author] = self.earned.get(author, 0.0) + min(max(now - self.last[author], 0.0), 60.0)
        self.last[author] = now
        if provenance.place is not None:
            self.place[author] = provenance.place

    def of(self, author: str, now: float) -> float:
        return min(1.0, self.earned.get(author, 0.0) / 600.0)

    def weights(self, authors: list[str], now: float) -> dict[str, float]:
        standing = {a: self.of(a, now) for a in authors}
        newcomers = sum(1 for s in standing.values() if s < 1.0)
        alone = {a: s + (0.1 * (1.0 - s) / newcomers if s < 1.0 else 0.0) for a, s in standing.items()}
        places: dict[str, list[str]] = defaultdict(list)
        for a in authors:
            places[self.place.get(a, f"author:{a}")].append(a)
        return {a: max(alone[b] for b in members) / len(members) for members in places.values() for a in members}


def events(scenario: str, rng: random.Random) -> tuple[list[tuple[float, str, bool]], list[str]]:
    """What reaches the node's standing in one hour: (time, author, asked), in time order, and
    the attackers' keys. A push by a 0.4.0 key is not asked for; an older release's is."""
    honest = [f"honest-{k}" for k in range(HONEST)]
    if scenario == "patient":
        attackers = [f"patient-{k}" for k in range(200)]
    else:
        attackers = [f"{scenario.split(',')[0]}-{k}" for k in range(20)]
    arrives = {a: 0.0 for a in honest}
    out: list[tuple[float, str, bool]] = []
    if scenario == "late":
        arrives |= {a: HOUR - 600.0 + 600.0 * rng.random() for a in attackers}
    elif scenario.startswith("pushers"):
        for a in attackers:
            start = 60.0 * rng.random()
            out += [(start + 60.0 * m, a, scenario != "pushers") for m in range(60)]
    else:  # patient: 10 minutes of a group a minute, ending 10 minutes before the hour
        for a in attackers:
            start = HOUR - 1200.0 + 60.0 * rng.random()
            out += [(start + 60.0 * m, a, True) for m in range(10)]
    t = 0.0
    while t < HOUR:
        known = [a for a, at in arrives.items() if at <= t]
        out += [(t, a, True) for a in rng.sample(known, DRAWS)]
        t += ROUND_SECONDS
    return sorted(out), attackers


def run(scenario: str, rule: str, seed: int) -> dict:
    stream, attackers = events(scenario, random.Random(seed))
    standing = MainRule() if rule == "before" else Standing()
    # this release places every key posing as an older release in one place (node/core/exchange.py's
    # `provenance`); main placed each by its /16
    older = set(attackers) if rule == "after" and scenario in POSING_AS_OLDER else set()
    for t, author, asked in stream:
        place = OLDER_RELEASES_PLACE if author in older else f"/16 of {author}"
        # main credited every group the intake took: for a 0.4.0 key's push, as main at 896c779 did
        standing.credit(author, t, Provenance(asked or rule == "before", place=place))
    honest = [f"honest-{k}" for k in range(HONEST)]
    weights = standing.weights(honest + attackers, HOUR)
    honest_weight = sum(weights[a] for a in honest)
    attacker_weight = sum(weights[a] for a in attackers)
    return {
        "scenario": scenario,
        "rule": rule,
        "seed": seed,
        "honest_share": honest_weight / (honest_weight + attacker_weight),
        "honest_weight": honest_weight,
        "attacker_weight": attacker_weight,
        "honest_full": sum(1 for a in honest if standing.of(a, HOUR) >= 1.0),
    }


def report(rows: list[dict]) -> None:
    table = [["scenario", "rule", "honest share (mean)", "lowest", "honest at 1.0", "attackers' weight", "seeds"]]
    for scenario in SCENARIOS:
        for rule in ("before", "after"):
            mine = [r for r in rows if r["scenario"] == scenario and r["rule"] == rule]
            if not mine:
                continue
            shares = [float(r["honest_share"]) for r in mine]
            table.append(
                [
                    scenario,
                    rule,
                    f"{100 * statistics.fmean(shares):.1f} %",
                    f"{100 * min(shares):.1f} %",
                    f"{statistics.fmean(float(r['honest_full']) for r in mine):.1f} of {HONEST}",
                    f"{statistics.fmean(float(r['attacker_weight']) for r in mine):.2f}",
                    str(len(mine)),
                ]
            )
    print_rows(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="2 seeds")
    parser.add_argument("--out", type=Path, help="also write each seed's row to DIR/rows.csv")
    parser.add_argument("--report", type=Path, help="rebuild the table from DIR/rows.csv, running nothing")
    args = parser.parse_args()
    if args.report is not None:
        with (args.report / "rows.csv").open() as f:
            report(list(csv.DictReader(f)))
        return
    seeds = range(2 if args.smoke else args.seeds)
    rows = [run(scenario, rule, seed) for scenario in SCENARIOS for rule in ("before", "after") for seed in seeds]
    print(
        f"{HONEST} honest authors, {DRAWS} drawn a round, {ROUND_SECONDS:g} s rounds, one hour; "
        "honest share of the node's draw weight at the end of the hour"
    )
    report(rows)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / "rows.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
