"""bench/capture.py's tables, from OUT/rows.jsonl alone: per arm, the target's and the honest
nodes' rounds and draws, what the attack did, and issue #41 must-show 1's verdict.

A node's round record is bench/wild_node.py's, cumulative: [t, accepted, fresh in the inbox,
taken, links, ...]. Only rounds at or after the arm's warm-up count, and a round's accepted
groups are the difference from the record before it, counted up to J. A draw is one author a
fetch asked ([t, peer id, seconds]); it is honest if the author is one of the 7 honest nodes.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.text_table import print_rows

T, ACCEPTED, FRESH, TAKEN, LINKS = range(5)
SHARE_GOAL, HONEST_DRAW_GOAL = 0.90, 0.50
ATTACK_COUNTS = (
    "connected", "links_lost", "pushes", "pushes_refused", "discovery_answers", "sybils_sent",
    "group_requests_answered_empty", "group_requests_held",
)  # fmt: skip


def load(out: Path, run: str | None) -> tuple[str, list[dict]]:
    path = out / "rows.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run bench/capture.py first (without --report)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    runs = list(dict.fromkeys(row["run"] for row in rows if row["kind"] == "arm"))
    if not runs:
        raise ValueError(f"{path} holds no run")
    run = run or runs[-1]
    if run not in runs:
        raise ValueError(f"no run {run!r} in {path}; runs: {', '.join(runs)}")
    return run, [row for row in rows if row["run"] == run]


def node_rounds(node: dict, warmup_s: float, j: int) -> dict:
    """A node's measured rounds: accepted (up to J) and taken a round, and its links."""
    rounds = node["rounds"]
    accepted, taken, links = [], [], []
    for before, now in zip(rounds, rounds[1:]):
        if now[T] >= warmup_s:
            accepted.append(min(j, now[ACCEPTED] - before[ACCEPTED]))
            taken.append(now[TAKEN])
            links.append(now[LINKS])
    return {"accepted": accepted, "taken": taken, "links": links}


def classify(draws: list[list], warmup_s: float, honest: set[str], attack: dict | None) -> dict[str, int]:
    hosts = set(attack["hosts"]) if attack else set()
    holders = set(attack["holders"]) if attack else set()
    out = {"honest": 0, "attacker host": 0, "holder": 0, "sybil": 0}
    for t, author, _seconds in draws:
        if t < warmup_s:
            continue
        kind = (
            "honest"
            if author in honest
            else "attacker host"
            if author in hosts
            else "holder"
            if author in holders
            else "sybil"
        )
        out[kind] += 1
    return out


def arm_figures(header: dict, rows: list[dict]) -> dict:
    plan = header["plan"]
    j, warmup = plan["j"], plan["warmup_s"]
    honest = {life["peer_id"] for life in plan["lives"]}
    target_id = next(life["peer_id"] for life in plan["lives"] if life.get("target"))
    attack = next((r for r in rows if r["kind"] == "attack"), None)
    nodes = [r for r in rows if r["kind"] == "node"]
    figures = {}
    for who, members in (("target", [n for n in nodes if n["peer_id"] == target_id]),
                         ("honest nodes", [n for n in nodes if n["peer_id"] != target_id])):  # fmt: skip
        measured = [node_rounds(n, warmup, j) for n in members]
        accepted = [a for m in measured for a in m["accepted"]]
        taken = [t for m in measured for t in m["taken"]]
        links = [x for m in measured for x in m["links"]]
        draws = [classify(n.get("draws", []), warmup, honest, attack) for n in members]
        drawn = {k: sum(d[k] for d in draws) for k in ("honest", "attacker host", "holder", "sybil")}
        total = sum(drawn.values())
        network = {
            k: sum(n["network"].get(k, 0) for n in members) for k in ("fetch_timeouts", "fetch_failed", "fetch_dials")
        }
        figures[who] = {
            "nodes": len(members), "rounds": len(accepted),
            "accepted_share": sum(accepted) / (j * len(accepted)) if accepted else float("nan"),
            "accepted_worst": min(accepted, default=0), "taken_share": sum(taken) / (j * len(taken)) if taken else float("nan"),
            "taken_worst": min(taken, default=0), "links": sum(links) / len(links) if links else float("nan"),
            "drawn": drawn, "drawn_total": total, "honest_share": drawn["honest"] / total if total else float("nan"),
            "network": network,
        }  # fmt: skip
    figures["attack"] = attack["counts"] if attack else {}
    return figures


def report(out: Path, run: str | None) -> int:
    run, rows = load(out, run)
    headers = [r for r in rows if r["kind"] == "arm"]
    first = headers[0]
    print(f"run {run} (commit {first['commit']}{'+dirty' if first['dirty'] else ''}, {first['machine']})")
    print(f"command: {first['command']}")
    table = [["arm", "node", "rounds", "accepted/J mean", "worst", "taken/J mean", "worst", "links",
              "drawn", "honest of drawn", "attacker hosts", "holders", "sybils", "timeouts", "dials"]]  # fmt: skip
    attack_table = [["arm", "attackers", *ATTACK_COUNTS]]
    verdicts = []
    for header in headers:
        arm = header["arm"]
        figures = arm_figures(header, [r for r in rows if r.get("arm") == arm and r["kind"] != "arm"])
        for who in ("target", "honest nodes"):
            f = figures[who]
            d = f["drawn"]
            table.append([
                arm, who if who == "target" else f"{who} ({f['nodes']})", str(f["rounds"]),
                f"{f['accepted_share']:.3f}", str(f["accepted_worst"]), f"{f['taken_share']:.3f}", str(f["taken_worst"]),
                f"{f['links']:.1f}", str(f["drawn_total"]), f"{f['honest_share']:.1%}", str(d["attacker host"]),
                str(d["holder"]), str(d["sybil"]), str(f["network"]["fetch_timeouts"]), str(f["network"]["fetch_dials"]),
            ])  # fmt: skip
        attackers = len(header["plan"]["attack"]["hosts"]) if arm != "none" else 0
        attack_table.append([arm, str(attackers), *(str(figures["attack"].get(k, 0)) for k in ATTACK_COUNTS)])
        if header["failed_processes"]:
            verdicts.append(f"arm {arm}: processes {header['failed_processes']} failed; its figures are incomplete")
        if arm != "none":
            t = figures["target"]
            ok = t["accepted_share"] >= SHARE_GOAL and t["honest_share"] >= HONEST_DRAW_GOAL
            verdicts.append(
                f"arm {arm}: target accepted {t['accepted_share']:.1%} of J a round (goal >= {SHARE_GOAL:.0%}), "
                f"honest authors {t['honest_share']:.1%} of its draw (goal >= {HONEST_DRAW_GOAL:.0%}): "
                f"{'met' if ok else 'NOT met'}"
            )
    print_rows(table)
    print()
    print("the attacker's counts (all its hosts together)")
    print_rows(attack_table)
    print()
    for line in verdicts:
        print(line)
    return 0
