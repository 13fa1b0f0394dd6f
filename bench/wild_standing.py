"""bench/wild.py's `--standing` run (issue #42, must-show 1): who holds an honest node's draw
weight after an hour of a real swarm, against keys pushing on the topic and keys that arrived late.

One run, three kinds of key, every key in a /16 of its own (the attackers' best case for places,
and a public swarm's for honest nodes):

- **honest**: fetching nodes (the node's default exchange and standing), alive the whole hour;
- **pusher**: from the start, gossip-only keys posing as releases before 0.4.0 (identify lists
  the topic, not `/sapo/groups/1`, as `--stranger`'s peer) that keep a link to every honest node
  and put one valid group of their own a minute on the rollouts topic, sent to every node
  subscribed to it, not only to their mesh: the strongest pusher the node allows, whose own
  groups the node takes by right (protocol/network.py's `by_right` says "older") and credits as
  asked, every such key in one place (sampling/standing.py's `OLDER_RELEASES_PLACE`);
- **late**: fetching nodes like the honest ones, joining within the last `late_minutes`.

At the end of the hour each honest node weighs, from its own inbox's `Standing`, every author its
standing table knows and, separately, the authors its inbox holds (what it draws from): honest
authors' share of that weight against pushers alone, late keys alone, and both (`snapshot`).
Its row also counts, per kind of author, what reached its intake and what became of it (`Tally`).
bench/wild_standing_report.py prints the tables.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable

ROLES = ("honest", "pusher", "late")
# A SmolLM2 round's length (bench/results/smollm2-study): slower rounds than make run's 10 s, as the
# swarm this standing is for runs, and less CPU for this 2-core machine.
ROUND_SECONDS = 23.0
# Between the snapshots of each node's shares during the run (the rows' `standing_over_time`).
SNAPSHOT_SECONDS = 300.0
AGAINST = {"pushers": ("pusher",), "late": ("late",), "both": ("pusher", "late")}


def set_args(args) -> None:
    """The run's shape: `args.nodes` honest nodes, no churn, rounds of ROUND_SECONDS x [0.8, 1.25];
    every key in a /16 of its own. `--smoke`: 4 honest, 2 pushers, 2 late keys, 36 s, 10 s ramp."""
    args.churn_share, args.minutes, args.round_seconds = 0.0, args.standing_minutes, ROUND_SECONDS
    args.pace_spread = min(args.pace_spread, 1.25)
    args.groups = args.nodes + args.pushers + args.late
    if args.smoke:
        args.nodes, args.pushers, args.late, args.processes, args.seeds = 4, 2, 2, 2, 1
        args.groups, args.minutes, args.round_seconds, args.late_minutes = 8, 0.6, 6.0, 0.25
        args.start_delay, args.ramp_seconds, args.push_seconds, args.warmup_seconds = 10.0, 10.0, 8.0, 15.0


def attacker_lives(args, new_life: Callable[..., dict], first: int) -> list[dict]:
    """The pushers (from the start) and the late keys (joining over the minute that starts
    `late_minutes` before the end), numbered from `first`."""
    end = args.minutes * 60
    late_at = end - args.late_minutes * 60
    lives = []
    for k in range(args.pushers + args.late):
        index = first + k
        if k < args.pushers:
            life = new_life(index, index % args.processes, 2.0, False)
            life["role"] = "pusher"
        else:
            life = new_life(
                index, index % args.processes, late_at + min(60.0, end - late_at) * k / (args.pushers + args.late), True
            )
            life["role"] = "late"
        lives.append(life)
    return lives


def plan_fields(args, lives: list[dict]) -> dict:
    """What the node processes read of the run: every key's kind, the push interval, the ramp."""
    return {
        "standing": {
            "roles": {life["peer_id"]: life.get("role", "honest") for life in lives},
            "push_s": args.push_seconds,
            "ramp_s": args.ramp_seconds,
            "late_minutes": args.late_minutes,
            "snapshot_s": 15.0 if args.smoke else SNAPSHOT_SECONDS,
        }
    }


class Tally:
    """Per kind of author: what reached this node's intake (accepted, or refused by reason) and,
    of what it kept, how much earned standing (asked for) and how much did not."""

    def __init__(self, roles: dict[str, str]):
        self.roles = roles
        self.counts: dict[str, Counter] = defaultdict(Counter)

    def role(self, author: str) -> str:
        return self.roles.get(author, "other")

    def wrap_accept(self, accept: Callable) -> Callable:
        def counted(data, sender, *args, **kwargs):
            verdict = accept(data, sender, *args, **kwargs)
            self.counts[self.role(sender)][verdict.refusal or "accepted"] += 1
            return verdict

        return counted

    def stored(self, author: str, provenance) -> None:
        self.counts[self.role(author)]["earning" if provenance.asked else "not_earning"] += 1

    def to_json(self) -> dict:
        return {role: dict(counts) for role, counts in self.counts.items()}


def snapshot(standing, inbox_authors: list[str], roles: dict[str, str], me: str, now: float | None = None) -> dict:
    """Honest authors' share of this node's weight at `now`, over every author its standing table
    knows and over the authors its inbox holds, against each kind of attacker; and each author's
    kind, standing, place and weight among all (the table's)."""
    now = time.time() if now is None else now
    saved = standing.to_json()
    records = {row[0]: row for row in saved["newcomers"] + saved["established"]}
    out: dict = {"at": now, "authors": {}}
    for scope, authors in (("table", sorted(records)), ("inbox", sorted(set(inbox_authors)))):
        authors = [a for a in authors if a != me]
        kinds = {a: roles.get(a, "other") for a in authors}
        out[scope] = {"authors": dict(Counter(kinds.values()))}
        for name, attackers in AGAINST.items():
            weights = standing.weights([a for a in authors if kinds[a] in ("honest", *attackers)], now)
            honest = sum(w for a, w in weights.items() if kinds[a] == "honest")
            total = sum(weights.values())
            out[scope][name] = {
                "honest_share": honest / total if total > 0 else None,
                "honest_weight": honest,
                "attacker_weight": total - honest,
            }
        if scope == "table":
            weights = standing.weights(authors, now)
            out["authors"] = {
                a: [kinds[a], round(standing.of(a, now), 4), records[a][5], round(weights[a], 5)] for a in authors
            }
    return out
