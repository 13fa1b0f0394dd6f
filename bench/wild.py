"""A bench of the wild (issue #41): real node networks in network namespaces, with distinct
addresses in several /16s, a round trip of 100 ms, 1 % loss, churn, nodes at different paces and
half of all groups flat, in several OS processes; what each node gets and pays.

Each process (bench/wild_node.py) runs in a namespace of its own (bench/wild_net.py) and hosts
many nodes, each a real `serve_network` with the real exchange and intake (the daemon's path,
node/daemon/run.py, without the model). Seeds are every node's bootstrap list, as a public
swarm's would be, and are never replaced; every `--churn-seconds` a share of the other nodes
leaves and as many newcomers (new keys, new addresses) join. Each node's round lasts the base
round times a factor drawn log-uniformly from 0.5x-2x; it shares 2 groups a round, half of all
groups flat (the intake refuses those), and wants `groups_wanted(J)`. bench/wild_link.py says
how bytes and CPU are given to each node, and how latency is emulated (this kernel has no netem).

    nice -n 5 .venv/bin/python -m bench.wild --smoke          # 10 nodes, 2 processes, ~3 min
    nice -n 5 .venv/bin/python -m bench.wild                  # 64 nodes, 4 processes, 20 min
    nice -n 5 .venv/bin/python -m bench.wild --stranger       # 16 nodes; a gossip-only stranger joins
    nice -n 5 .venv/bin/python -m bench.wild --standing --out bench/results/standing-swarm
                                  # 32 honest nodes, 20 pushers, 20 late keys, one hour (bench/wild_standing.py)
    .venv/bin/python -m bench.wild --standing --smoke --out /tmp/standing  # 4 + 2 + 2 keys, ~1 min
    .venv/bin/python -m bench.wild --report [--run ID]         # the tables from the rows alone
    .venv/bin/python -m bench.wild --cleanup                   # namespaces a killed run left behind

Rows go to bench/results/wild/rows.jsonl (one per node life, one per process, one for the run);
bench/wild_report.py rebuilds every table from them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

from bench import wild_net, wild_standing
from bench.ns_runs import provenance, row_lines, run_in_namespaces, say

OUT = Path(__file__).resolve().parent / "results" / "wild"
ROOT = Path(__file__).resolve().parents[1]
PORT = 4001
# The node's legacy rule waits this long before a gossip-only peer counts (protocol/network.py's
# LEGACY_AFTER_SECONDS), and a little more for its identify and the mesh.
STRANGER_SETTLE_S = 40.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=64, help="nodes alive at any time")
    p.add_argument("--processes", type=int, default=4, help="OS processes, each in its own namespace")
    p.add_argument("--groups", type=int, default=4, help="IPv4 /16s the addresses are spread over")
    p.add_argument("--seeds", type=int, default=3, help="bootstrap nodes, never replaced")
    p.add_argument("--round-seconds", type=float, default=10.0, help="base round (make run's: about 10 s)")
    p.add_argument("--pace-spread", type=float, default=2.0, help="round = base x [1/s, s], log-uniform")
    p.add_argument("--j", type=int, default=4, help="external groups a round trains on (J)")
    p.add_argument("--flat-share", type=float, default=0.5, help="share of all groups that are flat")
    p.add_argument("--rtt-ms", type=float, default=100.0, help="round trip between any two nodes")
    p.add_argument("--loss-percent", type=float, default=1.0, help="packets dropped entering each namespace")
    p.add_argument("--churn-share", type=float, default=0.10, help="share of the nodes replaced at each churn")
    p.add_argument("--churn-seconds", type=float, default=150.0, help="between churns (the goal's: 600)")
    p.add_argument("--minutes", type=float, default=20.0, help="length of the run, start-up included")
    p.add_argument("--warmup-seconds", type=float, default=90.0, help="left out of the per-round figures")
    p.add_argument("--load-seconds", type=float, default=3.0, help="a joining node fetches this long before rounds")
    p.add_argument("--discover-peers", type=int, default=4, help="discovery's target (the node's default)")
    p.add_argument(
        "--connections-low", type=int, default=64, help="the connection manager's low watermark (the node's)"
    )
    p.add_argument("--connections-high", type=int, default=96, help="its high watermark (the node's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-delay", type=float, default=45.0, help="for the processes to import and start")
    p.add_argument("--out", type=Path, default=OUT, help="rows go to OUT/rows.jsonl, appended")
    p.add_argument("--smoke", action="store_true", help="10 nodes, 2 processes, 3 minutes")
    p.add_argument("--stranger", action="store_true", help="16 nodes, no churn; a gossip-only stranger joins")
    p.add_argument("--window-seconds", type=float, default=300.0, help="--stranger: each measured window")
    p.add_argument("--standing", action="store_true", help="honest nodes, pushers and late keys; standing at the end")
    p.add_argument("--pushers", type=int, default=20, help="--standing: gossip-only keys pushing from the start")
    p.add_argument("--push-seconds", type=float, default=60.0, help="--standing: between a pusher's groups")
    p.add_argument("--late", type=int, default=20, help="--standing: fetching keys joining near the end")
    p.add_argument("--late-minutes", type=float, default=9.0, help="--standing: they join this long before the end")
    p.add_argument("--standing-minutes", type=float, default=60.0, help="--standing: the run's length")
    p.add_argument("--ramp-seconds", type=float, default=None, help="the nodes' standing ramp (default: theirs)")
    p.add_argument("--report", action="store_true", help="only the tables, from OUT's rows")
    p.add_argument("--run", default=None, help="--report: this run (default: the newest)")
    p.add_argument("--cleanup", action="store_true", help=f"delete namespaces named {wild_net.PREFIX}*")
    args = p.parse_args(argv)
    if args.standing:
        wild_standing.set_args(args)
    elif args.smoke:
        args.nodes, args.processes, args.seeds, args.minutes = 10, 2, 2, 3.0
        args.churn_seconds, args.warmup_seconds, args.start_delay = 45.0, 40.0, 30.0
    if args.stranger:
        args.nodes, args.churn_share, args.minutes = (
            16,
            0.0,
            (args.warmup_seconds + 2 * args.window_seconds + STRANGER_SETTLE_S + 10) / 60,
        )
        args.processes = min(args.processes, 2)
    return args


def identity(keys: Path, name: str) -> str:
    from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of

    return peer_id_of(load_or_create_identity(keys / name))


def pace(rng: random.Random, spread: float) -> float:
    return math.exp(rng.uniform(-math.log(spread), math.log(spread)))


def plan_run(args: argparse.Namespace, tmp: Path) -> dict:
    """Every node life, where and when it runs, and (with --stranger) the stranger and the windows."""
    rng = random.Random(args.seed)
    used: dict[tuple[int, int], int] = {}

    def new_address(process: int, group: int) -> str:
        used[(group, process)] = used.get((group, process), 0) + 1
        return wild_net.address(group, process, used[(group, process)] - 1)

    def new_life(index: int, process: int, start: float, newcomer: bool) -> dict:
        name = f"n{index}"
        ip = new_address(process, index % args.groups)  # with --standing, a /16 a key
        return {
            "id": name, "process": process, "ip": ip, "key": str(tmp / "keys" / name), "peer_id": identity(tmp / "keys", name),
            "seed": index < args.seeds and not newcomer, "newcomer": newcomer, "round_s": round(args.round_seconds * pace(rng, args.pace_spread), 2),
            "phase": rng.random(), "start_s": start, "stop_s": None,
        }  # fmt: skip

    ramp = min(20.0, args.warmup_seconds / 3)
    lives = [
        new_life(i, i % args.processes, 0.0 if i < args.seeds else 2.0 + ramp * i / args.nodes, False)
        for i in range(args.nodes)
    ]
    end = args.minutes * 60
    if args.standing:
        lives += wild_standing.attacker_lives(args, new_life, len(lives))
    churned = max(1, round(args.nodes * args.churn_share)) if args.churn_share > 0 else 0
    t = args.churn_seconds
    while churned and t < end - 30:
        alive = [life for life in lives if not life["seed"] and life["stop_s"] is None]
        for leaving in rng.sample(alive, churned):
            leaving["stop_s"] = t
            lives.append(new_life(len(lives), leaving["process"], t, True))
        t += args.churn_seconds
    seeds = [f"/ip4/{life['ip']}/tcp/{PORT}/p2p/{life['peer_id']}" for life in lives if life["seed"]]
    plan = {
        "run": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()), "swarm": "wild", "port": PORT, "seed": args.seed,
        "j": args.j, "want": wanted(args.j), "groups_per_round": 2, "flat_share": args.flat_share,
        "delay_s": args.rtt_ms / 2000, "loss_percent": args.loss_percent, "load_s": args.load_seconds,
        "discover_peers": args.discover_peers, "connections_low": args.connections_low,
        "connections_high": args.connections_high, "base_round_s": args.round_seconds, "pace_spread": args.pace_spread,
        "churn_seconds": args.churn_seconds, "churn_share": args.churn_share, "nodes": args.nodes,
        "processes": args.processes, "groups": args.groups, "end_s": end, "warmup_s": args.warmup_seconds,
        "seeds": seeds, "lives": lives, "stranger": None, "rows": str(tmp / "rows-{process}.jsonl"),
        "ramp_s": args.ramp_seconds,
    }  # fmt: skip
    if args.standing:
        plan |= wild_standing.plan_fields(args, lives)
    if args.stranger:
        a0 = args.warmup_seconds
        b0 = a0 + args.window_seconds + STRANGER_SETTLE_S
        plan["windows"] = {"without": [a0, a0 + args.window_seconds], "with": [b0, b0 + args.window_seconds]}
        plan["stranger"] = {
            "id": "stranger", "process": 0, "ip": wild_net.address(args.groups, 0, 0), "key": str(tmp / "keys" / "stranger"),
            "start_s": a0 + args.window_seconds, "peers": [f"/ip4/{x['ip']}/tcp/{PORT}/p2p/{x['peer_id']}" for x in lives],
        }  # fmt: skip
    return plan


def wanted(j: int) -> int:
    from sapo.node.core.exchange import groups_wanted

    return groups_wanted(j)


def addresses_by_process(plan: dict) -> list[list[str]]:
    out: list[list[str]] = [[] for _ in range(plan["processes"])]
    for life in plan["lives"]:
        out[life["process"]].append(life["ip"])
    if plan["stranger"]:
        out[plan["stranger"]["process"]].append(plan["stranger"]["ip"])
    return out


def run(args: argparse.Namespace, command: str) -> str:
    """Plan, build the namespaces, run the processes, gather their rows; the run's id."""
    problem = wild_net.available()
    if problem:
        raise SystemExit(f"bench/wild.py needs network namespaces: {problem}")
    prefix = f"{wild_net.PREFIX}{os.getpid() % 100000}"
    with tempfile.TemporaryDirectory(prefix="sapo-wild-") as tmp_name:
        tmp = Path(tmp_name)
        plan = plan_run(args, tmp)
        spaces = wild_net.build(prefix, addresses_by_process(plan), args.loss_percent)
        try:
            plan["t0"] = time.time() + args.start_delay
            (tmp / "plan.json").write_text(json.dumps(plan))
            load_before = round(os.getloadavg()[0], 2)
            say(
                f"run {plan['run']}: {len(plan['lives'])} node lives, {args.processes} processes, {plan['end_s']:.0f} s"
            )
            failed = run_processes(plan, spaces, tmp)
            loss = {space: wild_net.loss_counts(space) for space in spaces.processes}
        finally:
            wild_net.remove(prefix)
        rows = [
            json.loads(line) for k in range(args.processes) for line in row_lines(Path(plan["rows"].format(process=k)))
        ]
    if failed:
        raise SystemExit(f"processes {failed} failed: no rows written (their logs are above)")
    header = {
        "kind": "run", "run": plan["run"], "plan": {k: v for k, v in plan.items() if k not in ("lives", "rows", "seeds")},
        "loss": loss, "failed_processes": failed, **provenance(load_before, command),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "rows.jsonl").open("a") as out:
        for row in [header, *rows]:
            out.write(json.dumps(row) + "\n")
    say(f"{len(rows)} rows written to {args.out / 'rows.jsonl'}")
    return plan["run"]


def run_processes(plan: dict, spaces: wild_net.Namespaces, tmp: Path) -> list[str]:
    """One process per namespace, until the plan's end; the processes that failed."""
    commands = {
        f"process-{k}": (space, ["-m", "bench.wild_node", str(tmp / "plan.json"), str(k)])
        for k, space in enumerate(spaces.processes)
    }
    return run_in_namespaces(commands, tmp, plan["t0"] + plan["end_s"] + 120)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cleanup:
        removed = wild_net.remove(wild_net.PREFIX)
        say(f"removed {len(removed)} namespaces: {' '.join(removed) or '-'}")
        return 0
    run_id = args.run
    if not args.report:
        run_id = run(args, shlex.join(["python", "-m", "bench.wild", *(sys.argv[1:] if argv is None else argv)]))
    from bench.wild_report import report  # after the run: a report bug must not cost its rows

    return report(args.out, run_id)


if __name__ == "__main__":
    sys.exit(main())
