"""Capture, end to end (issue #41, must-show 1): a real node under 100 attacker connections from
4 network groups feeding its discovery Sybil records, beside 6 honest connections in 6 groups;
the groups it accepts a round, and whom its fetcher actually asks.

Each arm builds network namespaces joined by a bridge (bench/wild_net.py) with globally routable
addresses (11.81-11.91.x.x: the node counts every 10.x address in one "local" group, so the
/16s must be public ones for its group caps and its draw to tell them apart; the namespaces
reach nothing outside them). Two processes:

- honest (bench/capture_node.py): the target and 6 honest nodes, each in its own /16, each a
  bench/wild_node.py node life (the daemon's `serve_network` with the node's defaults,
  `exchange="fetch"`, the real exchange, intake and memory; rounds of 10 s that take up to J=4
  groups from the inbox, publish 2 fresh groups with signal and want `groups_wanted(4)`). All 7
  are each other's seeds, so the target holds 6 honest links, one per /16. Every fetcher's draw
  is logged (which authors it asked);
- attacker (bench/capture_attack.py, not in arm `none`): `--hosts-per-group` hosts in each of 4
  /16s, each its own key and address, connected to the target, answering its discovery with
  its own record and 15 Sybils (arm `dead`: keys minted per answer naming dead addresses;
  `holding`: real hosts that hold a group request and never answer).

Per arm: each node's rounds after the warm-up (the attack has fed the table by then): accepted
groups a round as a share of J (each round counted up to J), the worst round, the share the
inbox gave the round to train on, and the honest share of the authors the target's fetcher
asked.

    nice -n 5 .venv/bin/python -m bench.capture                     # arms none, dead, holding: ~40 min
    nice -n 5 .venv/bin/python -m bench.capture --smoke             # 8 attackers, ~2.5 min an arm
    .venv/bin/python -m bench.capture --report [--run ID]           # the table from the rows alone
    .venv/bin/python -m bench.capture --cleanup                     # namespaces a killed run left

Rows go to bench/results/capture/rows.jsonl: one per arm, per node life, per process.
Needs root, `ip` and `nft` (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

from bench import wild_net
from bench.capture_report import report
from bench.ns_runs import provenance, row_lines, run_in_namespaces, say

OUT = Path(__file__).resolve().parent / "results" / "capture"
ROOT = Path(__file__).resolve().parents[1]
PREFIX = "scap"
ARMS = ("none", "dead", "holding")
PORT = 4001
TARPIT_PORT = 4002
ATTACKER_GROUPS = 4
HONEST = 6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--hosts-per-group", type=int, default=25, help="attacker connections from each of 4 /16s")
    p.add_argument("--holders-per-group", type=int, default=32, help="arm holding: holding hosts in each /16")
    p.add_argument("--round-seconds", type=float, default=10.0)
    p.add_argument("--j", type=int, default=4, help="external groups a round trains on (J)")
    p.add_argument("--flat-share", type=float, default=0.0, help="share of honest groups that are flat")
    p.add_argument("--attack-start", type=float, default=30.0, help="s after t0 the first attackers dial")
    p.add_argument("--warmup-seconds", type=float, default=150.0, help="left out of the figures")
    p.add_argument("--measure-seconds", type=float, default=600.0, help="rounds measured after the warm-up")
    p.add_argument("--push-seconds", type=float, default=30.0, help="an attacker pushes its record this often")
    p.add_argument("--batch", type=int, default=8, help="attackers of a /16 that dial at once...")
    p.add_argument("--batch-seconds", type=float, default=35.0, help="...every this many seconds")
    p.add_argument("--start-delay", type=float, default=40.0, help="for the processes to import and start")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=OUT, help="rows go to OUT/rows.jsonl, appended")
    p.add_argument("--smoke", action="store_true", help="8 attackers, 2 rounds measured, arms none and dead")
    p.add_argument("--report", action="store_true", help="only the table, from OUT's rows")
    p.add_argument("--run", default=None, help="--report: this run (default: the newest)")
    p.add_argument("--cleanup", action="store_true", help=f"delete namespaces named {PREFIX}*")
    args = p.parse_args(argv)
    if args.smoke:
        args.hosts_per_group, args.holders_per_group, args.attack_start = 2, 4, 5.0
        args.warmup_seconds, args.measure_seconds, args.start_delay, args.batch_seconds = 25.0, 25.0, 25.0, 5.0
        args.arms = [arm for arm in args.arms if arm != "holding"] if args.arms == list(ARMS) else args.arms
    return args


def ip_at(group: int, block: int, index: int) -> str:
    """An address in 11.<81+group>.<block>.<index+1>: group 0-3 the attacker's, 4-9 honest, 10 the target's."""
    return f"11.{81 + group}.{block}.{index + 1}"


def plan_arm(args: argparse.Namespace, arm: str, run: str, tmp: Path) -> dict:
    """The 7 honest node lives (in bench/wild_node.py's plan format) and the attack."""
    from sapo.node.core.exchange import groups_wanted
    from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of

    rng = random.Random(args.seed)
    lives = []
    for index in range(1 + HONEST):
        name = f"n{index}"
        ip = ip_at(ATTACKER_GROUPS + HONEST if index == 0 else ATTACKER_GROUPS + index - 1, 0, 0)
        key = tmp / "keys" / name
        lives.append({
            "id": name, "process": 0, "ip": ip, "key": str(key), "peer_id": peer_id_of(load_or_create_identity(key)),
            "seed": True, "newcomer": False, "round_s": args.round_seconds, "phase": rng.random(),
            "start_s": 0.0, "stop_s": None, "target": index == 0,
        })  # fmt: skip
    seeds = [f"/ip4/{life['ip']}/tcp/{PORT}/p2p/{life['peer_id']}" for life in lives]
    groups = range(ATTACKER_GROUPS)
    attack = {
        "arm": arm, "port": PORT, "tarpit_port": TARPIT_PORT, "target": seeds[0], "start_s": args.attack_start,
        "push_seconds": args.push_seconds, "batch": args.batch, "batch_seconds": args.batch_seconds,
        "hosts": [ip_at(g, 1, k) for g in groups for k in range(args.hosts_per_group)],
        "holders": [ip_at(g, 2, k) for g in groups for k in range(args.holders_per_group)] if arm == "holding" else [],
        "rows": str(tmp / "attack.jsonl"),
    }  # fmt: skip
    end = args.warmup_seconds + args.measure_seconds
    return {
        "run": run, "arm": arm, "swarm": "capture", "port": PORT, "seed": args.seed, "j": args.j,
        "want": groups_wanted(args.j), "groups_per_round": 2, "flat_share": args.flat_share, "delay_s": 0.0,
        "loss_percent": 0.0, "load_s": 3.0, "discover_peers": 4, "connections_low": 64, "connections_high": 96,
        "base_round_s": args.round_seconds, "nodes": len(lives), "processes": 1 if arm == "none" else 2,
        "end_s": end, "warmup_s": args.warmup_seconds, "seeds": seeds, "lives": lives, "stranger": None,
        "rows": str(tmp / "rows-{process}.jsonl"), "attack": attack,
    }  # fmt: skip


def run_arm(args: argparse.Namespace, arm: str, run: str, command: str) -> list[dict]:
    """Build the arm's namespaces, run its processes, gather their rows (its header first)."""
    prefix = f"{PREFIX}{os.getpid() % 100000}"
    with tempfile.TemporaryDirectory(prefix="sapo-capture-") as tmp_name:
        tmp = Path(tmp_name)
        plan = plan_arm(args, arm, run, tmp)
        attack = plan["attack"]
        addresses = [[life["ip"] for life in plan["lives"]]]
        if arm != "none":
            addresses.append(attack["hosts"] + attack["holders"])
        spaces = wild_net.build(prefix, addresses, 0.0)
        try:
            plan["t0"] = time.time() + args.start_delay
            (tmp / "plan.json").write_text(json.dumps(plan))
            say(f"arm {arm}: {len(attack['hosts']) if arm != 'none' else 0} attackers, {plan['end_s']:.0f} s of rounds")
            load_before = round(os.getloadavg()[0], 2)
            failed = run_processes(plan, spaces.processes, tmp)
        finally:
            wild_net.remove(prefix)
        rows = [json.loads(line) for line in row_lines(Path(plan["rows"].format(process=0)))]
        rows += [json.loads(line) for line in row_lines(Path(attack["rows"]))]
    header = {
        "kind": "arm", "run": run, "arm": arm, "failed_processes": failed,
        "plan": {k: v for k, v in plan.items() if k not in ("rows", "seeds")},
        **provenance(load_before, command),
    }  # fmt: skip
    return [header, *({**row, "arm": arm} for row in rows)]


def run_processes(plan: dict, spaces: list[str], tmp: Path) -> list[str]:
    """The honest process, and the attacker's unless the arm has none; the names of those that failed."""
    commands = {"honest": ["-m", "bench.capture_node", str(tmp / "plan.json"), "0"]}
    if plan["arm"] != "none":
        commands["attack"] = ["-m", "bench.capture_attack", str(tmp / "plan.json")]
    in_spaces = {name: (space, cmd) for (name, cmd), space in zip(commands.items(), spaces)}
    return run_in_namespaces(in_spaces, tmp, plan["t0"] + plan["end_s"] + 90)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cleanup:
        removed = wild_net.remove(PREFIX)
        say(f"removed {len(removed)} namespaces: {' '.join(removed) or '-'}")
        return 0
    run_id = args.run
    if not args.report:
        problem = wild_net.available()
        if problem:
            raise SystemExit(f"bench/capture.py needs network namespaces: {problem}")
        command = shlex.join(["python", "-m", "bench.capture", *(sys.argv[1:] if argv is None else argv)])
        run_id = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        args.out.mkdir(parents=True, exist_ok=True)
        for arm in args.arms:
            rows = run_arm(args, arm, run_id, command)
            with (args.out / "rows.jsonl").open("a") as out:  # each arm's rows as soon as it ends
                for row in rows:
                    out.write(json.dumps(row) + "\n")
    return report(args.out, run_id)


if __name__ == "__main__":
    sys.exit(main())
