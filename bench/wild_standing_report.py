"""bench/wild.py --standing's tables, from the run's rows alone (bench/wild_standing.py says what
each honest node measured): honest authors' share of its weight at the end of the hour against
pushers, late keys and both, over its standing table and over its inbox; and what the attackers
got to it, so that a high share cannot hide an attack that never happened.
"""

from __future__ import annotations

import statistics
from collections import Counter

from bench.text_table import print_rows
from bench.wild_standing import AGAINST

GOAL = 0.80  # issue #42 must-show 1: honest authors hold >= 80 % of a node's draw weight
SCOPES = {"table": "every author its standing table knows", "inbox": "the authors its inbox holds (the draw)"}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def report_standing(header: dict, rows: list[dict]) -> int:
    plan = header["plan"]
    nodes = [r for r in rows if r["kind"] == "node"]
    honest = [r for r in nodes if r.get("role") == "honest" and r.get("standing")]
    pushers = [r for r in nodes if r.get("role") == "pusher"]
    late = [r for r in nodes if r.get("role") == "late"]
    standing = plan["standing"]
    print(
        f"run {header['run']} (commit {header.get('commit')}{', dirty' if header.get('dirty') else ''}): "
        f"{len(honest)} honest nodes measured, {len(pushers)} pushers, {len(late)} late keys, "
        f"{plan['end_s'] / 60:.0f} min, base round {plan['base_round_s']:g} s, "
        f"push every {standing['push_s']:g} s, late keys join {standing['late_minutes']:g} min before the end, "
        f"ramp {standing['ramp_s'] or 'the node default'}; load {header.get('load_before')} -> {header.get('load_after')}"
    )
    if not honest:
        print("no honest node wrote its standing: nothing to report")
        return 1
    print_shares(honest)
    print_over_time(honest)
    print_standing(honest)
    print_activity(honest, pushers, late)
    print_reach(honest, pushers)
    print_rounds(honest)
    return 0


def print_shares(honest: list[dict]) -> None:
    table = [
        ["weighed over", "against", "honest share: mean", "min", "max", f"nodes >= {GOAL:.0%}", "mean or min >= 80 %"]
    ]
    for scope in SCOPES:
        for against in AGAINST:
            shares = [s for r in honest if (s := r["standing"][scope][against]["honest_share"]) is not None]
            if not shares:
                table.append([scope, against, "-", "-", "-", "0", "-"])
                continue
            mean, low = statistics.fmean(shares), min(shares)
            table.append(
                [scope, against, pct(mean), pct(low), pct(max(shares)), f"{sum(s >= GOAL for s in shares)} of {len(shares)}",
                 f"mean {yes(mean >= GOAL)}, min {yes(low >= GOAL)}"]
            )  # fmt: skip
    print("\nhonest authors' share of each honest node's weight at the end (Standing.weights):")
    for scope, says in SCOPES.items():
        print(f"  {scope}: {says}")
    print_rows(table)


def print_over_time(honest: list[dict]) -> None:
    """The mean honest share over each node's standing table at each snapshot during the run."""
    snapshots: dict[int, list[dict]] = {}
    for r in honest:
        for k, snap in enumerate(r.get("standing_over_time", [])):
            snapshots.setdefault(k, []).append(snap)
    if not snapshots:
        return
    table = [["minute (mean)", "nodes", *(f"vs {against}: mean" for against in AGAINST), "vs both: min"]]
    for k in sorted(snapshots):
        snaps = snapshots[k]
        cells = []
        for against in AGAINST:
            shares = [x for snap in snaps if (x := snap["table"][against]["honest_share"]) is not None]
            cells.append(pct(statistics.fmean(shares)) if shares else "-")
        both = [x for snap in snaps if (x := snap["table"]["both"]["honest_share"]) is not None]
        table.append([f"{statistics.fmean(snap['t'] for snap in snaps) / 60:.1f}", str(len(snaps)), *cells,
                      pct(min(both)) if both else "-"])  # fmt: skip
    print("\nduring the run, over each node's standing table:")
    print_rows(table)


def print_standing(honest: list[dict]) -> None:
    """Per kind of author, over the honest nodes: how many each node's table knows, how many of
    those stand at 1.0, their mean standing and their mean weight each."""
    table = [
        ["kind", "known (mean)", "at full standing (mean)", "min at full", "standing (mean)", "weight each (mean)"]
    ]
    for kind in ("honest", "pusher", "late", "other"):
        known, full, marks, weights = [], [], [], []
        for r in honest:
            mine = [a for a in r["standing"]["authors"].values() if a[0] == kind]
            known.append(len(mine))
            full.append(sum(a[1] >= 1.0 for a in mine))
            marks += [a[1] for a in mine]
            weights += [a[3] for a in mine]
        if not marks:
            continue
        table.append(
            [kind, f"{statistics.fmean(known):.1f}", f"{statistics.fmean(full):.1f}", str(min(full)),
             f"{statistics.fmean(marks):.3f}", f"{statistics.fmean(weights):.3f}"]
        )  # fmt: skip
    print("\neach kind of author in an honest node's standing table at the end (weights over all of them):")
    print_rows(table)


def print_activity(honest: list[dict], pushers: list[dict], late: list[dict]) -> None:
    """What the attackers got to the honest nodes: per kind, what reached their intake and what
    became of it, summed and per node, and what the topic's guard refused before the intake."""
    table = [
        [
            "author kind",
            "reached intake (sum)",
            "accepted (sum)",
            "earning (sum)",
            "not earning",
            "min accepted a node",
            "refused, by reason (sum)",
        ]
    ]
    for kind in ("honest", "pusher", "late", "other"):
        counts = [Counter(r["by_author_kind"].get(kind, {})) for r in honest]
        total = sum(counts, Counter())
        if not total:
            table.append([kind, "0", "0", "0", "0", "0", "-"])
            continue
        refused = {k: v for k, v in total.items() if k not in ("accepted", "earning", "not_earning")}
        table.append(
            [kind, str(total["accepted"] + sum(refused.values())), str(total["accepted"]), str(total["earning"]),
             str(total["not_earning"]), str(min(c["accepted"] for c in counts)),
             ", ".join(f"{k} {v}" for k, v in sorted(refused.items(), key=lambda kv: -kv[1])) or "-"]
        )  # fmt: skip
    print(f"\nwhat reached the {len(honest)} honest nodes' intake, by its author's kind:")
    print_rows(table)
    guard = sum(
        (Counter({k: v for k, v in r["network"].items() if k in ("pushed_refused", "unasked")}) for r in honest),
        Counter(),
    )
    print(
        f"pushers: {sum(p.get('pushed', 0) for p in pushers)} groups published in all "
        f"({min((p.get('pushed', 0) for p in pushers), default=0)}-{max((p.get('pushed', 0) for p in pushers), default=0)} a key), "
        f"{sum(p['shared'] for p in pushers)} honest groups received; "
        f"refused by the honest nodes' topic guard before any check: {dict(guard) or 0}"
    )
    joined = [r["joined_s"] for r in late if r.get("joined_s") is not None]
    if joined:
        print(f"late keys: {len(joined)} joined, at {min(joined) / 60:.1f}-{max(joined) / 60:.1f} min")


def print_reach(honest: list[dict], pushers: list[dict]) -> None:
    """How far the pushes could go, by 10 minutes: each pusher's links to honest nodes, the peers it
    had a pubsub stream to, subscribed, and could send to, and the deaf links it dropped
    (bench/wild_node.py's `push_reach`, `redial_deaf`); and each honest node's pushers connected,
    taken for older releases, and reading its own groups. Rows from before these were kept have none."""
    windows: dict[int, list[list]] = {}
    for r in pushers:
        for record in r["rounds"]:
            windows.setdefault(int(record[0] // 600), []).append(record[1:])
    if windows:
        table = [["minutes", "pushes", "links", "pubsub peers", "subscribed", "sendable", "deaf links dropped (sum)"]]
        for w in sorted(windows):
            recs = windows[w]
            means = [f"{statistics.fmean(rec[k] for rec in recs):.1f}" for k in range(4)]
            dropped = sum(rec[4] for rec in recs if len(rec) > 4)
            table.append([f"{10 * w}-{10 * w + 10}", str(len(recs)), *means, str(dropped)])
        print(
            f"\neach push's reach (mean over the pushes in each window; {len(honest)} honest nodes; links: to anyone):"
        )
        print_rows(table)
    snaps: dict[int, list[list]] = {}
    for r in honest:
        for k, snap in enumerate(r.get("standing_over_time", [])):
            if "pushers" in snap:
                snaps.setdefault(k, []).append([snap["t"], *snap["pushers"]])
    if snaps:
        table = [
            [
                "minute (mean)",
                "pushers connected (mean)",
                "taken for older releases",
                "reading its groups",
                "min connected",
            ]
        ]
        for k in sorted(snaps):
            recs = snaps[k]
            table.append(
                [f"{statistics.fmean(x[0] for x in recs) / 60:.1f}", *(f"{statistics.fmean(x[i] for x in recs):.1f}" for i in (1, 2, 3)),
                 str(min(x[1] for x in recs))]
            )  # fmt: skip
        print("\nthe pushers each honest node saw:")
        print_rows(table)


def print_rounds(honest: list[dict]) -> None:
    """Whether the machine kept the honest nodes' rounds on time: each round's start against its
    schedule (the node's first round plus its pace; a late round runs at once, as soon as it can)."""
    late = [
        r["rounds"][k][0] - (r["rounds"][0][0] + k * r["round_s"])
        for r in honest
        if r["rounds"] and r["round_s"]
        for k in range(len(r["rounds"]))
    ]
    if late:
        print(
            f"\nhonest rounds: {len(late)}; started late by {statistics.fmean(late):.2f} s on average, "
            f"{sorted(late)[int(0.99 * (len(late) - 1))]:.2f} s at the 99th percentile, {max(late):.2f} s at most"
        )


def yes(ok: bool) -> str:
    return "yes" if ok else "no"
