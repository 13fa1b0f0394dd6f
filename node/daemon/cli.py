"""The daemon's commands: `start` (one node), `swarm` (N local node processes), `status`
(what a node is doing, from its data dir or its page's port) and `plot`.

Thin: parse the settings, check them, call the library. Nothing heavy (torch, libp2p) is
imported until the settings are known to be good, so a bad flag is refused in well under a second.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path

from sapo.node.flags import add_settings_arguments, configure_logging, node_settings_from_flags, settings_from_args

GIL_SWITCH_SECONDS = 0.001


def cmd_start(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if args.dry_run:
        print(settings.model_dump_json(indent=1))
        return 0
    import trio

    from sapo.node.daemon.run import run_node
    from sapo.training.models.devices import configure_torch_threads

    configure_logging(settings.run.log_level)
    configure_torch_threads(settings.model.torch_threads)
    # Generation runs in a worker thread and holds the GIL between torch ops; the trio loop,
    # which serves gossip, gets it at the next forced switch. 1 ms instead of Python's 5: the
    # GIL's share of a 1 ms sleeper's p99 during tiny-model generation fell from 5-8 ms to
    # 1-2 ms (docs/bench/gossip-during-update.md), for a hand-off every 1 ms while both want it.
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    trio.run(run_node, settings, args.stop_with_parent)
    # Everything is saved (run_node checkpoints on the way out). Spare the interpreter's exit
    # its full garbage collections of the ~500k objects torch, transformers and the tasks
    # leave: on a loaded 2-core box they took 20 s after SIGTERM, past docker stop's 10 s,
    # and 2 s once frozen (tests/docker/compose_swarm.py times the stop).
    gc.freeze()
    return 0


def cmd_swarm(args: argparse.Namespace) -> int:
    from sapo.node.swarm import check_swarm_flags

    node_args = list(args.node_args)
    # Fail fast on a bad node setting, here, rather than N times in N log files.
    check_swarm_flags(node_args)
    node_settings_from_flags(node_args)
    if args.nodes < 1:
        raise ValueError(f"--nodes must be at least 1, got {args.nodes}")
    import trio

    from sapo.node.swarm import run_swarm

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failed = trio.run(run_swarm, args.nodes, args.data_dir, node_args, args.seed, args.progress_every)
    return 1 if failed else 0


def cmd_status(args: argparse.Namespace) -> int:
    from sapo.node.daemon.status import render_text, status_from_data_dir, status_from_url

    if (args.data_dir is None) == (args.url is None):
        raise ValueError(
            "give a node's data directory (sapo-node status DATA_DIR) or its page (--url http://127.0.0.1:9100)"
        )
    status = status_from_url(args.url) if args.url else status_from_data_dir(args.data_dir)
    print(status.model_dump_json(indent=1) if args.json else render_text(status))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from sapo.node.daemon.plot import plot_rewards

    if args.window < 1:
        raise ValueError("--window must be at least 1")
    out = plot_rewards(args.data_dirs, args.out, window=args.window, metric=args.metric)
    print(f"wrote {out}")
    return 0


def add_commands(sub) -> None:
    start = sub.add_parser(
        "start",
        help="run a node",
        usage="sapo-node start [-h] [--config FILE] [--dry-run] [--SETTING VALUE ...]",
        description="Run a node until --rounds are done or Ctrl-C. The everyday settings come first; the "
        "rest tune the model, training, inbox, network and run, or set the study's treatments. Every "
        "setting is also a SAPO_<NAME> environment variable and a key of the --config TOML file "
        "(docs/settings.md).",
    )
    add_settings_arguments(start)
    start.add_argument("--dry-run", action="store_true", help="validate the settings, print them as JSON and exit")
    # process plumbing, not a setting: `sapo-node swarm` gives its nodes its own pid
    start.add_argument("--stop-with-parent", type=int, metavar="PID", help=argparse.SUPPRESS)
    start.set_defaults(func=cmd_start)
    swarm = sub.add_parser(
        "swarm",
        help="run N nodes as local processes wired over libp2p on 127.0.0.1",
        description="Start N `sapo-node start` processes on 127.0.0.1, each wired to the first, with its own "
        "data directory DATA_DIR/node-I. Any other flag is a node setting passed to every node "
        "(see `sapo-node start --help`). Ctrl-C stops them all cleanly.",
    )
    swarm.add_argument("--nodes", type=int, default=3, help="number of nodes (default: 3)")
    swarm.add_argument("--data-dir", type=Path, default=Path("sapo-swarm"), help="parent of the nodes' data dirs")
    swarm.add_argument("--seed", type=int, default=0, help="node I gets seed SEED+I (default: 0)")
    swarm.add_argument("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    swarm.set_defaults(func=cmd_swarm, takes_node_flags=True)
    status = sub.add_parser(
        "status",
        help="what a node is doing: reward, peers, inbox, rejections, judge",
        description="Print a node's summary: the same as its page. From its data directory (works on a "
        "stopped node too) or from a running node's --metrics-port.",
    )
    status.add_argument("data_dir", nargs="?", type=Path, metavar="DATA_DIR", help="the node's --data-dir")
    status.add_argument("--url", help="a running node's page, e.g. http://127.0.0.1:9100")
    status.add_argument("--json", action="store_true", help="print the status as JSON (the page's /api/status)")
    status.set_defaults(func=cmd_status)
    plot = sub.add_parser("plot", help="PNG reward curves from nodes' metrics.jsonl", description="One line per node.")
    plot.add_argument("data_dirs", nargs="+", type=Path, metavar="DATA_DIR", help="node data directories")
    plot.add_argument("--out", type=Path, default=Path("rewards.png"), help="PNG to write (default: rewards.png)")
    plot.add_argument("--window", type=int, default=100, help="moving-average window in rounds (default: 100)")
    plot.add_argument("--metric", default="reward_mean", help="metrics.jsonl key to plot (default: reward_mean)")
    plot.set_defaults(func=cmd_plot)
