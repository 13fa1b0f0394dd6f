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
    import trio

    from sapo.node.daemon import run_node

    settings = settings_from_args(args)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sapo-node",
        description="A SAPO swarm node: trains its own policy with GRPO and shares decoded rollouts with peers.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="run a node", description="Run a node until --rounds are done or Ctrl-C.")
    add_settings_arguments(start)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "swarm":
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
        from sapo.training.errors import ModelSourceError

        if isinstance(exc, (CheckpointError, ModelSourceError, ValueError)):
            print(f"sapo-node: error: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
