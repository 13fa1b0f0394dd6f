"""The scale benchmark's table, model and figure, from OUT/rows.jsonl alone (bench/scale.py).

For each (mode, size) the newest row is used; every row stays in the file.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from bench.scale_model import (
    GROUPS_PER_AUTHOR,
    PACE_ROUND_S,
    SATURATED,
    SIMULATED,
    Model,
    RunMetrics,
    authors_a_round,
    fit,
    least_squares,
    melted,
    predict,
    predicted,
    run_metrics,
    simulate_authors,
    uniform_authors,
    validate,
)
from bench.text_table import print_rows

LABEL = {"gossip": "before (gossip)", "fetch": "after (fetch)"}
# Issue #31's goal for a node in a swarm of 10,000, at make run's pace.
GOAL_CORE, GOAL_BYTES, GOAL_RATIO, GOAL_AT = 0.05, 100_000, 2.0, 64
AUTHOR_ROUNDS = 100
# The model is validated on runs of up to this many nodes (both modes ran them): larger real runs
# are predicted by that fit, as a test of the extrapolation. The projection to 1,000 and 10,000
# is then fitted on every healthy run, the largest included (issue #41).
FIT_MAX_NODES = 64
# One new connection's CPU, both ends, with one request, measured directly (35-38 ms; docs/bench/scale.md,
# "What a new connection costs"): the midpoint, for the sensitivity table.
MEASURED_DIAL_CPU_S = 0.0365


def load_rows(out: Path) -> list[dict]:
    path = out / "rows.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run bench/scale.py first (without --report)")
    newest: dict[tuple[str, int], dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            newest[(row["plan"]["mode"], row["plan"]["nodes"])] = row
    return [newest[key] for key in sorted(newest, key=lambda k: (k[0] != "gossip", k[1]))]  # before, then after


def real_table(runs: list[RunMetrics], j: int) -> None:
    print(f"\nReal runs, per node, at make run's pace (2 groups a node every {PACE_ROUND_S:g} s; J = {j}):")
    rows = [
        ["mode", "N", "round s", "load", "cores", "wanted", "KB/s in", "CPU % core", "idle %", "groups/round",
         "fetches/round", "dials/round", "links", "rounds >= J", "authors (ideal)"]
    ]  # fmt: skip
    for r in runs:
        ideal = uniform_authors(r.nodes, authors_a_round(r.groups_per_round, r.groups_per_author), r.rounds)
        rows.append(
            [LABEL[r.mode], str(r.nodes), f"{r.round_s:g}", f"{r.load:.1f}", f"{r.cores:.2f}", f"{r.wanted:.2f}",
             f"{r.pace_rx / 1e3:.1f}",
             f"{100 * r.pace_cpu:.2f}", f"{100 * r.idle_cpu:.2f}", f"{r.delivered:.1f}", f"{r.requests:.1f}",
             f"{r.dials:.2f}", f"{r.links:.1f}", f"{100 * r.coverage:.0f} %", f"{r.authors:.1f} ({ideal:.1f})"]
        )  # fmt: skip
    print_rows(rows)
    print("cores: the swarm process's CPU over the rounds; wanted: that and the time it waited for a core (the")
    print("kernel's schedstat; rows before it was recorded: CPU alone). One process cannot pass 1.0 (the GIL), and")
    print("near it timeouts cascade, so such a run measures the bench's limit, not a node's.")


def print_coefficients(model: Model, title: str) -> None:
    print(title)
    print(f"  idle per node: {1e3 * model.idle_cpu[0]:.3f} + {1e3 * model.idle_cpu[1]:.3f} x links ms CPU/s, "
          f"{model.idle_rx[0]:.0f} + {model.idle_rx[1]:.0f} x links B/s")  # fmt: skip
    print(f"  gossip: {1e3 * model.gossip_cpu:.2f} ms CPU and {model.gossip_rx / 1e3:.1f} KB in per delivered group")
    print(f"  fetch: {1e3 * model.fetch_cpu[0]:.2f} ms + {1e3 * model.fetch_cpu[1]:.2f} ms a dial CPU, "
          f"{model.fetch_rx[0] / 1e3:.2f} KB + {model.fetch_rx[1] / 1e3:.2f} KB a dial in, per request; "
          f"{model.requests:.2f} requests a round; links {model.links_fetch:.1f} (fetch), {model.links_gossip:.1f} (gossip)")  # fmt: skip


def node_rounds(rows: list[dict], j: int) -> None:
    """How many (node, round) pairs the report's rows measured, and how many fell short of J."""
    for mode in ("gossip", "fetch"):
        counted = [
            count
            for row in rows
            if row["plan"]["mode"] == mode
            for node in row["result"]["new_per_round"]
            for count in (node[:-1] if mode == "gossip" else node)
        ]
        print(f"{LABEL[mode]}: {len(counted):,} node-rounds measured, {sum(c < j for c in counted)} with fewer than J")


def sensitivity_table(model: Model, fit_small: Model, runs: list[RunMetrics]) -> None:
    """The projection at the largest simulated size when one assumption changes at a time."""
    nodes = SIMULATED[-1]
    fetch = [r for r in runs if r.mode == "fetch"]
    at64 = next(r for r in fetch if r.nodes == GOAL_AT)
    request_only = least_squares([[r.requests] for r in fetch], [r.round_cpu for r in fetch])[0]
    variants = [
        ("as fitted (every healthy run, non-negative)", model, None),
        (f"fitted on the runs of {FIT_MAX_NODES} nodes or fewer", fit_small, None),
        ("the dial term dropped, as before #41 (requests alone)", replace(model, fetch_cpu=[request_only, 0.0]), None),
        (f"a dial's CPU as measured directly ({1e3 * MEASURED_DIAL_CPU_S:.1f} ms)",
         replace(model, fetch_cpu=[model.fetch_cpu[0], MEASURED_DIAL_CPU_S]), None),
        ("8 links (a connection manager's low watermark)", model, 8.0),
        ("50 links", model, 50.0),
        ("1.5x the requests a round (retries under loss)", replace(model, requests=1.5 * model.requests), None),
    ]  # fmt: skip
    print(f"\nSensitivity of the fetch projection at {nodes:,} nodes (one assumption changed at a time):")
    rows = [["assumption", "CPU % core", "KB/s in", "x real at 64", "goal"]]
    for label, variant, links in variants:
        p = predict(variant, "fetch", nodes, links=links)
        ratio = max(p.pace_cpu / at64.pace_cpu, p.pace_rx / at64.pace_rx)
        ok = p.pace_cpu <= GOAL_CORE and p.pace_rx <= GOAL_BYTES and ratio <= GOAL_RATIO
        rows.append(
            [label, f"{100 * p.pace_cpu:.2f}", f"{p.pace_rx / 1e3:.1f}", f"{ratio:.2f}", "meets" if ok else "misses"]
        )
    print_rows(rows)


def model_table(
    model: Model, runs: list[RunMetrics], groups_per_round: int, want: int, held_out: list[RunMetrics]
) -> None:
    print_coefficients(model, f"\nModel, fitted on the runs of {FIT_MAX_NODES} nodes or fewer (scale_model.py):")
    print(
        "\nValidation: each run against the model fitted without its size (leave one size out); runs of more"
        f" than {FIT_MAX_NODES} nodes against the model as fitted (held out):"
    )
    rows = [["mode", "N", "CPU % real", "model", "error", "KB/s real", "model", "error", "dials real", "model"]]
    for v in validate(runs, groups_per_round, want) + [predicted(model, r) for r in held_out]:
        rows.append(
            [LABEL[v.mode], str(v.nodes), f"{100 * v.real_cpu:.2f}", f"{100 * v.model_cpu:.2f}", f"{v.cpu_error:+.0%}",
             f"{v.real_rx / 1e3:.1f}", f"{v.model_rx / 1e3:.1f}", f"{v.rx_error:+.0%}", f"{v.real_dials:.2f}",
             f"{v.model_dials:.2f}"]
        )  # fmt: skip
    print_rows(rows)


def simulated_table(model: Model, runs: list[RunMetrics], want: int) -> None:
    authors = authors_a_round(want, GROUPS_PER_AUTHOR)
    print(
        f"\nSimulated, per node at make run's pace; authors over {AUTHOR_ROUNDS} rounds of {want} groups"
        f" ({authors:g} authors, {GROUPS_PER_AUTHOR} groups each):"
    )
    rows = [["mode", "N", "KB/s in", "CPU % core", "x real at 64", "dials/round", "authors uniform", "authors (table)"]]
    for mode in ("gossip", "fetch"):
        at64 = next((r for r in runs if r.mode == mode and r.nodes == GOAL_AT), None)
        for nodes in SIMULATED:
            p = predict(model, mode, nodes)
            ratio = max(p.pace_cpu / at64.pace_cpu, p.pace_rx / at64.pace_rx) if at64 else float("nan")
            per_round = authors if mode == "fetch" else model.groups_per_round * (nodes - 1)
            uniform = uniform_authors(nodes, per_round, AUTHOR_ROUNDS)
            table = (
                simulate_authors(nodes, int(authors), AUTHOR_ROUNDS, round(model.links_fetch))
                if mode == "fetch"
                else uniform
            )
            rows.append(
                [LABEL[mode], f"{nodes:,}", f"{p.pace_rx / 1e3:.1f}", f"{100 * p.pace_cpu:.2f}", f"{ratio:.2f}",
                 f"{p.dials:.2f}", f"{uniform:.0f}", f"{table:.0f}"]
            )  # fmt: skip
            if mode == "fetch" and nodes == SIMULATED[-1]:
                ok = p.pace_cpu <= GOAL_CORE and p.pace_rx <= GOAL_BYTES and ratio <= GOAL_RATIO
                verdict = "meets" if ok else "misses"
                goal = f"<= {GOAL_RATIO:g}x its cost at {GOAL_AT}, <= {100 * GOAL_CORE:g} % of a core, <= {GOAL_BYTES / 1e3:g} KB/s"
    print_rows(rows)
    if any(r.mode == "fetch" for r in runs):
        print(f"Goal at {SIMULATED[-1]:,} nodes ({goal}): fetch {verdict} it.")


def plot(model: Model, runs: list[RunMetrics], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    sizes = sorted({8, 16, 32, 64, 128, 256, 512, *SIMULATED, 2_000, 5_000})
    for mode, colour in (("gossip", "tab:red"), ("fetch", "tab:blue")):
        real = [r for r in runs if r.mode == mode]
        if not real:
            continue
        line = [predict(model, mode, n) for n in sizes]
        for ax, real_of, model_of, scale in (
            (axes[0], lambda r: r.pace_rx, lambda p: p.pace_rx, 1e-3),
            (axes[1], lambda r: r.pace_cpu, lambda p: p.pace_cpu, 100),
        ):
            ax.plot(
                sizes, [model_of(p) * scale for p in line], color=colour, lw=1.2, ls="--", label=f"{LABEL[mode]}, model"
            )
            ax.plot(
                [r.nodes for r in real],
                [real_of(r) * scale for r in real],
                "o",
                color=colour,
                label=f"{LABEL[mode]}, real",
            )
    for ax, goal, unit in (
        (axes[0], GOAL_BYTES / 1e3, "KB/s in, per node"),
        (axes[1], 100 * GOAL_CORE, "CPU, % of one core, per node"),
    ):
        ax.axhline(goal, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("nodes in the swarm")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"A node's network cost at make run's pace (2 groups / {PACE_ROUND_S:g} s); dotted: issue #31's goal",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(out: Path, j: int = 4, smoke: bool = False) -> int:
    from sapo.node.core.exchange import groups_wanted

    rows = load_rows(out)
    runs = [run_metrics(row, j) for row in rows]
    groups_per_round = rows[0]["plan"]["groups_per_round"]
    print(f"scale benchmark: {len(rows)} runs from {out / 'rows.jsonl'}; {rows[-1]['machine']}")
    real_table(runs, j)
    node_rounds(rows, j)
    healthy = [r for r in runs if not melted(r)]
    if len(healthy) < len(runs):
        left = ", ".join(f"{r.mode} {r.nodes}" for r in runs if melted(r))
        print(f"left out of the model (wanted >= {SATURATED} of a core, or under one group a round): {left}")
    # Validated on the sizes both modes ran; larger runs are held out, to test the extrapolation.
    fitted = [r for r in healthy if r.nodes <= FIT_MAX_NODES]
    held_out = [r for r in healthy if r.nodes > FIT_MAX_NODES]
    fit_small = fit(fitted, groups_per_round, groups_wanted(j))
    model_table(fit_small, fitted, groups_per_round, groups_wanted(j), held_out)
    # The projection: fitted on every healthy run, the largest (closest to what is projected) included.
    model = fit(healthy, groups_per_round, groups_wanted(j))
    print_coefficients(model, "\nProjection model, fitted on every healthy run:")
    simulated_table(model, healthy, groups_wanted(j))
    if any(r.mode == "fetch" and r.nodes == GOAL_AT for r in healthy):
        sensitivity_table(model, fit_small, healthy)
    path = out / "scale.png"
    plot(model, healthy, path)
    print(f"\nfigure: {path}")
    return 0
