"""`sapo-node`: one entry point for the node's programs, each in its own subpackage:
the daemon (`start`, `swarm`, `status`, `plot`), the study (`experiment`) and the judge (`judge`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from sapo.node.core.settings import SettingsError, explain
from sapo.node.daemon import cli as daemon_cli
from sapo.node.judge import cli as judge_cli
from sapo.node.study import cli as study_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sapo-node",
        description="A SAPO swarm node: trains its own policy with GRPO and shares decoded rollouts with peers.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for program in (daemon_cli, study_cli, judge_cli):
        program.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "takes_node_flags", False):
        args.node_args = extra  # swarm and experiment pass node settings on to every node
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except SettingsError as exc:
        print(f"sapo-node: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # the judge's and the study's own settings
        print("sapo-node: invalid settings:\n  " + "\n  ".join(explain(exc)), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - user-facing errors print cleanly, with the fix
        from sapo.protocol.peers.identity import IdentityError
        from sapo.training.learning.checkpoints import CheckpointError
        from sapo.training.models.errors import ModelSourceError

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
