"""`sapo-node`: thin entry points that parse settings and call library functions."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import typing
from pathlib import Path
from typing import Any, Sequence

from sapo.node.settings import CONCERNS, SettingsError, load_settings, parse_text_value


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per settings field, help text from the field's description and default."""
    parser.add_argument("--config", type=Path, help="TOML file of settings (lowest precedence after defaults)")
    for concern, model in CONCERNS.items():
        group = parser.add_argument_group(f"{concern} settings")
        for name, info in model.model_fields.items():
            default = info.get_default(call_default_factory=True)
            help_text = f"{info.description} (default: {default!s})"
            if info.annotation is bool:
                group.add_argument(
                    _flag(name), dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text
                )
            elif typing.get_origin(info.annotation) is list:
                group.add_argument(_flag(name), dest=name, nargs="*", default=argparse.SUPPRESS, help=help_text)
            else:
                group.add_argument(_flag(name), dest=name, default=argparse.SUPPRESS, help=help_text)


def settings_from_args(args: argparse.Namespace):
    given: dict[str, Any] = {}
    for concern, model in CONCERNS.items():
        for name, info in model.model_fields.items():
            if name not in vars(args):
                continue
            value = getattr(args, name)
            if isinstance(value, str):
                value = parse_text_value(_flag(name), info.annotation, value)
            elif isinstance(value, list):
                value = [item for v in value for item in parse_text_value(_flag(name), list[str], v)]
            given[name] = value
    return load_settings(given, args.config, os.environ)


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # libp2p sets its own logger to WARNING with propagate=False; give it our handler, and keep
    # its chatty INFO (the auto-connector's every-10-s status) out unless debugging.
    libp2p = logging.getLogger("libp2p")
    libp2p.handlers = logging.getLogger().handlers
    libp2p.setLevel("DEBUG" if level == "DEBUG" else "WARNING")
    logging.getLogger("libp2p.network.auto_connector").setLevel("DEBUG" if level == "DEBUG" else "WARNING")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def cmd_start(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if args.dry_run:
        print(settings.model_dump_json(indent=1))
        return 0
    import trio

    from sapo.node.daemon import run_node

    _configure_logging(settings.run.log_level)
    trio.run(run_node, settings)
    return 0


def cmd_swarm(args: argparse.Namespace) -> int:
    import trio

    from sapo.node.swarm import run_swarm

    node_args = list(args.node_args)
    # Fail fast on a bad node setting, here, rather than N times in N log files.
    settings_from_args(build_parser().parse_args(["start", *node_args]))
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failed = trio.run(run_swarm, args.nodes, args.data_dir, node_args, args.seed, args.progress_every)
    return 1 if failed else 0


def cmd_plot(args: argparse.Namespace) -> int:
    from sapo.node.plot import plot_rewards

    if args.window < 1:
        raise ValueError("--window must be at least 1")
    out = plot_rewards(args.data_dirs, args.out, window=args.window, metric=args.metric)
    print(f"wrote {out}")
    return 0


def experiment_node_flags(node_args: list[str]) -> list[str]:
    """Every study node's flags: the experiment's defaults, then the user's flags on top."""
    from sapo.node.experiment_settings import EXPERIMENT_NODE_DEFAULTS, EXPERIMENT_TINY_DEFAULTS
    from sapo.training.tiny import is_tiny

    base = settings_from_args(build_parser().parse_args(["start", *EXPERIMENT_NODE_DEFAULTS, *node_args]))
    if not is_tiny(base.model.model):
        return [*EXPERIMENT_NODE_DEFAULTS, *node_args]
    return [*EXPERIMENT_NODE_DEFAULTS, *EXPERIMENT_TINY_DEFAULTS, *node_args]


def experiment_node_settings(node_args: list[str]):
    return settings_from_args(build_parser().parse_args(["start", *experiment_node_flags(node_args)]))


def cmd_experiment(args: argparse.Namespace) -> int:
    from sapo.node.experiment import resummarize, run_experiment
    from sapo.node.experiment_settings import ExperimentSettings

    if getattr(args, "resummarize", None):
        summary = resummarize(Path(args.resummarize), int(args.ma_window) if getattr(args, "ma_window", None) else None)
        print(f"rewrote {args.resummarize}/summary.md, summary.json, curves.png over {summary['rounds_compared']} rounds")
        return 0
    node_flags = experiment_node_flags(args.node_args)
    base = settings_from_args(build_parser().parse_args(["start", *node_flags]))
    study = ExperimentSettings(**{name: getattr(args, name) for name in ExperimentSettings.model_fields if name in vars(args)})
    _configure_logging(base.run.log_level)
    summary = run_experiment(study, base, node_flags)
    print(f"wrote {study.out}/summary.md, summary.json, curves.png, raw.jsonl "
          f"in {summary['timing']['wall_seconds']:.0f}s", flush=True)
    return 0


def _add_experiment_parser(sub) -> None:
    from sapo.node.experiment_settings import ExperimentSettings

    experiment = sub.add_parser(
        "experiment",
        allow_abbrev=False,  # --seed must reach the nodes, not abbreviate --seeds
        help="run the controlled I/J study with all nodes in one process",
        description="Run every --configs arm for --seeds seeds with all nodes in one process, sharing "
        "through an in-memory exchange (the real codec and checks). Any other flag is a node setting "
        "for every node (see `sapo-node start --help`); defaults here: --model tiny-micro --updates-per-batch 1 "
        "--minibatches 1 --torch-threads 1, and for tiny models --tasks basic_arithmetic --max-new-tokens 24 "
        "--warm-start-steps 300 --lr 3e-4.",
    )
    for name, info in ExperimentSettings.model_fields.items():
        default = info.get_default(call_default_factory=True)
        help_text = f"{info.description} (default: {','.join(default) if isinstance(default, list) else default})"
        if info.annotation is bool:
            experiment.add_argument(_flag(name), dest=name, action=argparse.BooleanOptionalAction,
                                    default=argparse.SUPPRESS, help=help_text)
        else:
            experiment.add_argument(_flag(name), dest=name, default=argparse.SUPPRESS, help=help_text)
    experiment.set_defaults(func=cmd_experiment)


def cmd_judge(args: argparse.Namespace) -> int:
    import trio

    from sapo.node.judge import JudgeSettings, run_judge

    if args.judge_command == "report":
        from sapo.node.judge_report import judge_report

        print(judge_report(args.report_data_dir, args.out, window=args.window))
        print(f"wrote {args.out}")
        return 0
    given = {
        k: v
        for k, v in (
            ("data_dir", args.data_dir), ("listen", args.listen), ("seed", args.seed), ("identity_seed", args.identity_seed)
        )
        if v is not None
    }
    if args.tasks:
        given["tasks"] = [t for v in args.tasks for t in parse_text_value("--tasks", list[str], v)]
    settings = JudgeSettings(**given)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    trio.run(run_judge, settings)
    return 0


def _add_judge_parser(sub) -> None:
    judge = sub.add_parser(
        "judge",
        help="run the open judge, or `judge report` on its results",
        description="Serve /sapo/judge/1: nodes started with --judge ADDR are asked a held-out ReasoningGYM "
        "question every --judge-every rounds, answer greedily, and every score is stored in "
        "DATA_DIR/judge.sqlite. `sapo-node judge report` prints a leaderboard and writes a PNG.",
    )
    judge.add_argument("--data-dir", type=Path, default=None, help="identity key and judge.sqlite (default: sapo-judge)")
    judge.add_argument("--listen", default=None, help="multiaddr to listen on (default: /ip4/0.0.0.0/tcp/4101)")
    judge.add_argument("--tasks", nargs="*", default=None, help="ReasoningGYM tasks to ask (default: the paper's nine)")
    judge.add_argument("--seed", type=int, default=None, help="dataset seed of the judge's questions (default: 1000003)")
    judge.add_argument(
        "--identity-seed", default=None, help="derive the judge's identity from this 32-byte hex seed (local demos only)"
    )
    judge.set_defaults(func=cmd_judge, judge_command=None)
    judge_sub = judge.add_subparsers(dest="judge_command")
    report = judge_sub.add_parser("report", help="leaderboard and PNG of the judge's results")
    report.add_argument("--data-dir", dest="report_data_dir", type=Path, default=Path("sapo-judge"), help="the judge's data dir")
    report.add_argument("--out", type=Path, default=Path("judge.png"), help="PNG to write (default: judge.png)")
    report.add_argument("--window", type=int, default=20, help="moving-average window in results (default: 20)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sapo-node",
        description="A SAPO swarm node: trains its own policy with GRPO and shares decoded rollouts with peers.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="run a node", description="Run a node until --rounds are done or Ctrl-C.")
    add_settings_arguments(start)
    start.add_argument("--dry-run", action="store_true", help="validate the settings, print them as JSON and exit")
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
    swarm.set_defaults(func=cmd_swarm)
    plot = sub.add_parser("plot", help="PNG reward curves from nodes' metrics.jsonl", description="One line per node.")
    plot.add_argument("data_dirs", nargs="+", type=Path, metavar="DATA_DIR", help="node data directories")
    plot.add_argument("--out", type=Path, default=Path("rewards.png"), help="PNG to write (default: rewards.png)")
    plot.add_argument("--window", type=int, default=100, help="moving-average window in rounds (default: 100)")
    plot.add_argument("--metric", default="reward_mean", help="metrics.jsonl key to plot (default: reward_mean)")
    plot.set_defaults(func=cmd_plot)
    _add_experiment_parser(sub)
    _add_judge_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command in ("swarm", "experiment"):
        args.node_args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except SettingsError as exc:
        print(f"sapo-node: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - user-facing errors print cleanly, with the fix
        from sapo.training.checkpoints import CheckpointError
        from sapo.protocol.identity import IdentityError
        from sapo.training.errors import ModelSourceError

        # Errors from inside the daemon's nursery arrive wrapped in an ExceptionGroup.
        errors = list(_leaf_exceptions(exc))
        if all(isinstance(e, (CheckpointError, IdentityError, ModelSourceError, ValueError)) for e in errors):
            for error in errors:
                print(f"sapo-node: error: {error}", file=sys.stderr)
            return 1
        raise


def _leaf_exceptions(exc: BaseException):
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaf_exceptions(inner)
    else:
        yield exc


if __name__ == "__main__":
    sys.exit(main())
