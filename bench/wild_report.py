"""bench/wild.py's tables, from OUT/rows.jsonl alone: per node, then its spread across nodes, and
issue #41's must-show 6 targets (or, for a --stranger run, must-show 4's bytes per round).

A node's round record is cumulative: [t, accepted, fresh in the inbox, taken, links, CPU s, bytes
in, bytes out]; a round's figures are the differences between a record and the one before it.
Only rounds at or after the warm-up count. A round "gets J" when the inbox held J fresh accepted
groups for it to take (what it trains on); "J new" when J were accepted since the round before.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.text_table import print_rows

T, ACCEPTED, FRESH, TAKEN, LINKS, CPU, IN, OUT, LASTED = range(9)  # LASTED: rows from a4da4b1 on
# Must-show 6 and issue #31's scale goal.
COVERAGE_GOAL, NEWCOMER_GOAL_S, CORE_GOAL, BYTES_GOAL, STRANGER_GOAL = 0.95, 15.0, 0.05, 100_000, 0.10
PACE_ROUND_S = 10.0  # make run's round, at which the scale goal is set


def seed_links_row(plan: dict, seeds: list[dict]) -> list[str]:
    """Must-show 6's seed row: the most links each seed held, against the high watermark (runs
    made before the connection manager have none in their plan)."""
    high = plan.get("connections_high")
    if high is None:
        most = "most " + ", ".join(str(f["links_max"]) for f in seeds)
        return ["seed links under a connection manager's high watermark", most, "no manager yet"]
    lasted = [f["lasted_max"] for f in seeds]
    if None in lasted:  # rows before the count of links past their grace
        most = "most " + ", ".join(str(f["links_max"]) for f in seeds) + " (all links)"
        return [f"seed links under the high watermark ({high})", most, yes(max(f["links_max"] for f in seeds) <= high)]
    most = (
        "most "
        + ", ".join(str(n) for n in lasted)
        + " (all links: "
        + ", ".join(str(f["links_max"]) for f in seeds)
        + ")"
    )
    return [f"seed links past their grace under the high watermark ({high})", most, yes(max(lasted) <= high)]


def load(out: Path, run: str | None) -> tuple[dict, list[dict]]:
    path = out / "rows.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run bench/wild.py first (without --report)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    runs = [row for row in rows if row["kind"] == "run"]
    if not runs:
        raise ValueError(f"{path} holds no run")
    header = next((r for r in runs if r["run"] == run), None) if run else runs[-1]
    if header is None:
        raise ValueError(f"no run {run!r} in {path}; runs: {', '.join(r['run'] for r in runs)}")
    return header, [row for row in rows if row["run"] == header["run"] and row["kind"] != "run"]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def spread(values: list[float]) -> tuple[float, float, float, float]:
    """(median, p10, p90, max)."""
    return quantile(values, 0.5), quantile(values, 0.1), quantile(values, 0.9), max(values, default=float("nan"))


def within(rounds: list[list], start: float, end: float) -> list[list]:
    return [r for r in rounds if start <= r[T] <= end]


def node_figures(row: dict, start: float, end: float, j: int) -> dict | None:
    """One node life's figures over its rounds in [start, end]; None with fewer than two."""
    rounds = within(row["rounds"], start, end)
    if len(rounds) < 2:
        return None
    steps = list(zip(rounds, rounds[1:]))
    seconds = rounds[-1][T] - rounds[0][T]
    n = len(steps)
    return {
        "id": row["id"],
        "seed": row["seed"],
        "newcomer": row["newcomer"],
        "round_s": row["round_s"],
        "rounds": len(rounds),
        "gets_j": sum(r[TAKEN] >= j for r in rounds),
        "new_j": sum(b[ACCEPTED] - a[ACCEPTED] >= j for a, b in steps),
        "accepted": (rounds[-1][ACCEPTED] - rounds[0][ACCEPTED]) / n,
        "links": sum(r[LINKS] for r in rounds) / len(rounds),
        "links_max": max(r[LINKS] for r in rounds),
        "lasted_max": max((r[LASTED] for r in rounds if len(r) > LASTED), default=None),
        "in_round": (rounds[-1][IN] - rounds[0][IN]) / n,
        "out_round": (rounds[-1][OUT] - rounds[0][OUT]) / n,
        "in_s": (rounds[-1][IN] - rounds[0][IN]) / seconds,
        "out_s": (rounds[-1][OUT] - rounds[0][OUT]) / seconds,
        "cpu": (rounds[-1][CPU] - rounds[0][CPU]) / seconds,
        "cpu_round": (rounds[-1][CPU] - rounds[0][CPU]) / n,
        "steps": n,
    }


def overhead_per_node(header: dict, processes: list[dict]) -> float:
    """CPU of the processes that no node's task or thread ran (trio's scheduling, I/O polling,
    garbage collection), in cores per node alive: shared out evenly."""
    spare = sum(p["cpu_s"] - p["attributed_loop_s"] - p["thread_s"] for p in processes)
    wall = max((p["wall_s"] for p in processes), default=1.0)
    return spare / wall / header["plan"]["nodes"]


def newcomer_delays(rows: list[dict]) -> list[float | None]:
    """Seconds from a newcomer's join to its first accepted group (None: none in its life)."""
    return [
        None if r["first_accepted_s"] is None else r["first_accepted_s"] - r["joined_s"]
        for r in rows
        if r["newcomer"] and r["joined_s"] is not None
    ]


def print_spread(figures: list[dict], overhead: float) -> None:
    rows = [["per node", "median", "p10", "p90", "max"]]
    for label, key, scale, fmt in (
        ("accepted groups a round", "accepted", 1, "{:.2f}"),
        ("rounds that got J (%)", "gets_j_share", 100, "{:.0f}"),
        ("rounds with J new (%)", "new_j_share", 100, "{:.0f}"),
        ("links", "links", 1, "{:.1f}"),
        ("KB in a round", "in_round", 1e-3, "{:.1f}"),
        ("KB out a round", "out_round", 1e-3, "{:.1f}"),
        ("KB/s in", "in_s", 1e-3, "{:.2f}"),
        ("KB/s out", "out_s", 1e-3, "{:.2f}"),
        ("CPU, % of a core (+ process share)", "cpu_all", 100, "{:.2f}"),
    ):
        values = [f[key] * scale for f in figures]
        rows.append([label, *(fmt.format(v) for v in spread(values))])
    print_rows(rows)
    print(f"(the process share: {100 * overhead:.2f} % of a core per node, CPU no node's task ran, shared out evenly)")


def report_wild(header: dict, rows: list[dict]) -> int:
    plan = header["plan"]
    nodes = [r for r in rows if r["kind"] == "node"]
    processes = [r for r in rows if r["kind"] == "process"]
    j, start, end = plan["j"], plan["warmup_s"], plan["end_s"]
    overhead = overhead_per_node(header, processes)
    figures = [f for f in (node_figures(r, start, end, j) for r in nodes) if f is not None]
    if not figures:
        print_header(header, nodes, processes)
        print("no node has two rounds after the warm-up: nothing to report")
        return 1
    for f in figures:
        f["gets_j_share"] = f["gets_j"] / f["rounds"]
        f["new_j_share"] = f["new_j"] / f["steps"]
        f["cpu_all"] = f["cpu"] + overhead
    print_header(header, nodes, processes)
    print_nodes(figures)
    print(f"\nPer node over its rounds after {start:.0f} s ({len(figures)} node lives with two rounds or more):")
    print_spread(figures, overhead)
    counted = sum(f["rounds"] for f in figures)
    got = sum(f["gets_j"] for f in figures)
    new = sum(f["new_j"] for f in figures)
    seeds = [f for f in figures if f["seed"]]
    delays = newcomer_delays(nodes)
    reached = sorted(d for d in delays if d is not None)
    print(f"\nrounds that got J = {j} accepted groups: {got} of {counted} ({100 * got / max(1, counted):.1f} %); "
          f"with J accepted since the round before: {new} of {sum(f['steps'] for f in figures)}")  # fmt: skip
    print("seeds' links (mean, most): " + ", ".join(f"{f['id']} {f['links']:.0f}, {f['links_max']}" for f in seeds))
    if delays:
        print(f"newcomers: {len(delays)}; first accepted group after (s): median {quantile(reached, 0.5):.1f}, "
              f"p90 {quantile(reached, 0.9):.1f}, max {max(reached, default=float('nan')):.1f}; "
              f"never in their life: {delays.count(None)}")  # fmt: skip
    print_must_show_6(header, figures, got / max(1, counted), delays, seeds)
    return 0


def print_nodes(figures: list[dict]) -> None:
    """One line per node life: what it got and paid over its rounds after the warm-up."""
    rows = [["node", "kind", "round s", "rounds", "got J", "accepted/round", "links", "KB in/round", "KB out/round",
             "KB/s in", "KB/s out", "CPU %"]]  # fmt: skip
    for f in sorted(figures, key=lambda f: int(f["id"][1:])):
        kind = "seed" if f["seed"] else "newcomer" if f["newcomer"] else "node"
        rows.append([f["id"], kind, f"{f['round_s']:g}", str(f["rounds"]), f"{100 * f['gets_j_share']:.0f} %",
                     f"{f['accepted']:.2f}", f"{f['links']:.1f}", f"{f['in_round'] / 1e3:.1f}", f"{f['out_round'] / 1e3:.1f}",
                     f"{f['in_s'] / 1e3:.2f}", f"{f['out_s'] / 1e3:.2f}", f"{100 * f['cpu_all']:.2f}"])  # fmt: skip
    print()
    print_rows(rows)


def print_header(header: dict, nodes: list[dict], processes: list[dict]) -> None:
    plan = header["plan"]
    print(
        f"wild bench, run {header['run']} on {header['commit']}{' (dirty)' if header['dirty'] else ''}: "
        f"{plan['nodes']} nodes ({len(nodes)} lives) in {plan['processes']} processes, {plan['groups']} /16s, "
        f"RTT {2000 * plan['delay_s']:.0f} ms, loss {plan['loss_percent']:g} %, rounds {plan['base_round_s']:g} s x "
        f"{1 / plan['pace_spread']:g}-{plan['pace_spread']:g}, flat {100 * plan['flat_share']:.0f} %, "
        f"churn {100 * plan['churn_share']:.0f} % every {plan['churn_seconds']:g} s, {plan['end_s']:.0f} s, "
        f"connections {plan.get('connections_low', '-')}/{plan.get('connections_high', '-')}; "
        f"load {header['load_before']} -> {header['load_after']}; {header['machine']}"
    )
    for p in processes:
        print(
            f"  process {p['process']}: {p['cpu_s'] / p['wall_s']:.2f} cores, wanted {(p['cpu_s'] + p['waited_s']) / p['wall_s']:.2f} "
            f"(with its wait for a core); bytes on no node's socket {p['unowned_bytes']}, dials outside a node {p['unbound_dials']}"
        )
    entered = sum(v[0] for v in header["loss"].values())
    dropped = sum(v[1] for v in header["loss"].values())
    print(f"  loss rule: {dropped} of {entered} packets dropped ({100 * dropped / max(1, entered):.2f} %)")
    if header["failed_processes"]:
        print(f"  FAILED processes: {header['failed_processes']}")


def print_must_show_6(header: dict, figures: list[dict], coverage: float, delays: list, seeds: list[dict]) -> None:
    plan = header["plan"]
    overhead = figures[0]["cpu_all"] - figures[0]["cpu"]
    worst_cpu = max(f["cpu_all"] for f in figures)
    worst_bytes = max(max(f["in_s"], f["out_s"]) for f in figures)
    # At make run's pace (10 s rounds) a node pays its per-second costs plus a round's work every
    # 10 s; a round of L >= 10 s holds L s of the per-second costs, so a round's cost / 10 s bounds
    # it from above (only where every round is that long: time stretched to fit the machine).
    slowest = min(f["round_s"] for f in figures) >= PACE_ROUND_S
    bound_cpu = max(f["cpu_round"] / PACE_ROUND_S + overhead for f in figures)
    bound_bytes = max(max(f["in_round"], f["out_round"]) / PACE_ROUND_S for f in figures)
    reached = [d for d in delays if d is not None]
    in_time = sum(d <= NEWCOMER_GOAL_S for d in reached)
    conditions = (
        plan["nodes"] >= 64 and plan["processes"] >= 2 and plan["delay_s"] * 2000 >= 100 and plan["loss_percent"] >= 1
        and plan["churn_share"] >= 0.1 and plan["churn_seconds"] <= 600 and plan["flat_share"] >= 0.5
    )  # fmt: skip
    stretched = f", rounds stretched to {plan['base_round_s']:g} s" if plan["base_round_s"] > PACE_ROUND_S else ""
    print(
        f"\nMust-show 6 ({'the full conditions' if conditions else 'NOT the full conditions: a smaller run'}{stretched}):"
    )
    verdict = [
        ["target", "measured", "met"],
        [f">= {100 * COVERAGE_GOAL:.0f} % of rounds get J", f"{100 * coverage:.1f} %", yes(coverage >= COVERAGE_GOAL)],
        [f"newcomer's first accepted group <= {NEWCOMER_GOAL_S:g} s", f"{in_time} of {len(delays)} newcomers",
         yes(bool(delays) and in_time == len(delays))],
        seed_links_row(plan, seeds),
        [f"CPU <= {100 * CORE_GOAL:g} % of a core, every node", f"max {100 * worst_cpu:.2f} %", yes(worst_cpu <= CORE_GOAL)],
        [f"<= {BYTES_GOAL / 1e3:g} KB/s in and out, every node", f"max {worst_bytes / 1e3:.1f} KB/s", yes(worst_bytes <= BYTES_GOAL)],
    ]  # fmt: skip
    if plan["base_round_s"] > PACE_ROUND_S and slowest:
        verdict += [
            [f"  the same at make run's pace ({PACE_ROUND_S:g} s rounds), upper bound", f"max {100 * bound_cpu:.2f} %",
             yes(bound_cpu <= CORE_GOAL)],
            ["", f"max {bound_bytes / 1e3:.1f} KB/s", yes(bound_bytes <= BYTES_GOAL)],
        ]  # fmt: skip
    print_rows(verdict)


def yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def window_bytes(row: dict, window: list[float]) -> float | None:
    """Bytes in and out a round over the node's rounds in `window`; None with fewer than two."""
    rounds = within(row["rounds"], *window)
    if len(rounds) < 2:
        return None
    return (rounds[-1][IN] + rounds[-1][OUT] - rounds[0][IN] - rounds[0][OUT]) / (len(rounds) - 1)


def report_stranger(header: dict, rows: list[dict]) -> int:
    """Must-show 4 (bytes): each node's bytes a round without and with the stranger, and the same
    comparison between the two halves of the window without it (how much a node's bytes move
    with no stranger at all)."""
    plan = header["plan"]
    without, with_ = plan["windows"]["without"], plan["windows"]["with"]
    middle = (without[0] + without[1]) / 2
    print_header(header, [r for r in rows if r["kind"] == "node"], [r for r in rows if r["kind"] == "process"])
    stranger = next((r for r in rows if r["kind"] == "stranger"), None)
    if stranger:
        print(f"  stranger: joined at {stranger['joined_s']} s, {stranger['shared']} groups reached it on the topic")
    table = [["node", "round s", "B/round without", "with", "change", "first half", "second half", "change"]]
    changes, noise = [], []
    for row in sorted((r for r in rows if r["kind"] == "node"), key=lambda r: int(r["id"][1:])):
        a, b = window_bytes(row, without), window_bytes(row, with_)
        a1, a2 = window_bytes(row, [without[0], middle]), window_bytes(row, [middle, without[1]])
        if a is None or b is None:
            continue
        changes.append(b / a - 1)
        half = a2 / a1 - 1 if a1 and a2 else float("nan")
        noise.append(half)
        table.append([row["id"], f"{row['round_s']:g}", f"{a:,.0f}", f"{b:,.0f}", f"{b / a - 1:+.1%}", f"{a1 or 0:,.0f}",
                      f"{a2 or 0:,.0f}", f"{half:+.1%}"])  # fmt: skip
    print(f"\nBytes in and out a round per node, without the stranger ({without[0]:.0f}-{without[1]:.0f} s) and with it "
          f"({with_[0]:.0f}-{with_[1]:.0f} s, from {with_[0] - plan['stranger']['start_s']:.0f} s after it joined):")  # fmt: skip
    print_rows(table)
    largest = max(changes, key=abs, default=float("nan"))
    largest_noise = max((n for n in noise if n == n), key=abs, default=float("nan"))
    print(f"\nlargest change with the stranger: {largest:+.1%}; between the halves without it: {largest_noise:+.1%}")
    print(
        f"must-show 4 (no node's bytes a round change by more than {STRANGER_GOAL:.0%}): {yes(abs(largest) <= STRANGER_GOAL)}"
    )
    return 0


def report(out: Path, run: str | None = None) -> int:
    header, rows = load(out, run)
    if header["plan"].get("standing"):
        from bench.wild_standing_report import report_standing

        return report_standing(header, rows)
    if header["plan"].get("windows"):
        return report_stranger(header, rows)
    return report_wild(header, rows)
