"""Node settings from command-line flags: one flag per settings field, shared by `start`,
`swarm` (which passes flags on to its nodes) and `experiment` (which reads its nodes' flags).

Nothing heavy is imported here, so a bad flag is refused in well under a second."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import typing
from pathlib import Path
from typing import Any

from sapo.node.core.settings import (
    CONCERNS,
    NodeSettings,
    field_owner,
    load_settings,
    parse_text_value,
    settings_groups,
)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per settings field, help text from the field's description and default, in the
    groups of `settings_groups` (the everyday settings first)."""
    parser.add_argument("--config", type=Path, help="TOML file of settings (lowest precedence after defaults)")
    owner = field_owner()
    for title, names in settings_groups():
        group = parser.add_argument_group(title)
        for name in names:
            info = CONCERNS[owner[name]].model_fields[name]
            default = info.get_default(call_default_factory=True)
            help_text = f"{info.description} (default: {default!s})"
            if info.annotation is bool:
                group.add_argument(
                    flag(name),
                    dest=name,
                    action=argparse.BooleanOptionalAction,
                    default=argparse.SUPPRESS,
                    help=help_text,
                )
            elif typing.get_origin(info.annotation) is list:
                group.add_argument(flag(name), dest=name, nargs="*", default=argparse.SUPPRESS, help=help_text)
            else:
                group.add_argument(flag(name), dest=name, default=argparse.SUPPRESS, help=help_text)


def settings_from_args(args: argparse.Namespace) -> NodeSettings:
    given: dict[str, Any] = {}
    for model in CONCERNS.values():
        for name, info in model.model_fields.items():
            if name not in vars(args):
                continue
            value = getattr(args, name)
            if isinstance(value, str):
                value = parse_text_value(flag(name), info.annotation, value)
            elif isinstance(value, list):
                value = [item for v in value for item in parse_text_value(flag(name), list[str], v)]
            given[name] = value
    return load_settings(given, args.config, os.environ)


def node_settings_from_flags(flags: list[str]) -> NodeSettings:
    """Node settings from `start` flags given as a list (what `swarm` and `experiment` pass on)."""
    parser = argparse.ArgumentParser(prog="sapo-node start", allow_abbrev=False)
    add_settings_arguments(parser)
    return settings_from_args(parser.parse_args(flags))


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # libp2p sets its own logger to WARNING with propagate=False; give it our handler, and keep
    # its chatty INFO (the auto-connector's every-10-s status) out unless debugging.
    libp2p = logging.getLogger("libp2p")
    libp2p.handlers = logging.getLogger().handlers
    libp2p.setLevel("DEBUG" if level == "DEBUG" else "WARNING")
    logging.getLogger("libp2p.network.auto_connector").setLevel("DEBUG" if level == "DEBUG" else "WARNING")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
