"""`sapo-node start --help` is for people: the everyday settings first, the rest in named
groups, and every setting still a documented flag that reaches its field."""

import argparse
import json
import re
import subprocess
import sys
import typing

from sapo.node.core.settings import CONCERNS, EVERYDAY, field_owner, settings_groups
from sapo.node.flags import add_settings_arguments, settings_from_args

# A value other than its default for every setting that is not a bool, a choice or a number
# (those are derived below), as a user would type it.
OTHER = {
    "model": "tiny",
    "device": "cpu",
    "listen": "/ip4/127.0.0.1/tcp/4002",
    "swarm": "other",
    "log_level": "DEBUG",
    "metrics_host": "0.0.0.0",
    "identity_seed": "ab" * 32,
    "warm_start_share": "1/4",
    "data_dir": "elsewhere",
    "models_dir": "models-here",
    "lr": "0.0003",
    "metrics_port": "9100",
    "seed": "7",
    "micro_batch_size": "4",
    "draw_questions": "8",  # at least I + J (4 + 4 under the default adaptive balance)
    "warm_start_steps": "10",
    "judge": "/ip4/127.0.0.1/tcp/4101/p2p/12D3KooWJPtxrHVDPoETNfPJY4WWVzX7Ti4WPemtXDgb5qmFrDiv",
    "tasks": ["basic_arithmetic"],
    "peers": ["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWAiuDqrAu34MJemTVcjU4AtGeryEYP7BRcPRvQtkK87sm"],
    "allow_peers": ["12D3KooWAiuDqrAu34MJemTVcjU4AtGeryEYP7BRcPRvQtkK87sm"],
    "task_weights": {"basic_arithmetic": 2.0},
    "task_config": {"basic_arithmetic": {"operators": ["+"]}},
}


def other_value(name: str, info):
    """A valid value for the setting that is not its default."""
    default = info.get_default(call_default_factory=True)
    if name in OTHER:
        return OTHER[name]
    if isinstance(default, bool):
        return not default
    choices = typing.get_args(info.annotation)
    if typing.get_origin(info.annotation) is typing.Literal:
        return next(c for c in choices if c != default)
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default / 2 if default else 0.5
    raise AssertionError(f"no other value known for {name} (default {default!r}): add one to OTHER")


def test_every_setting_is_in_exactly_one_group():
    grouped = [name for _, names in settings_groups() for name in names]
    assert sorted(grouped) == sorted(field_owner()) and len(grouped) == len(set(grouped))
    assert settings_groups()[0] == ("everyday settings", list(EVERYDAY))


def test_every_setting_is_a_documented_flag_that_reaches_its_field(tmp_path):
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_settings_arguments(parser)
    flags = {action.dest: action for action in parser._actions if action.option_strings}
    owner = field_owner()
    swarm_key = tmp_path / "swarm.key"
    swarm_key.write_text("/key/swarm/psk/1.0.0/\n/base16/\n" + "0" * 64 + "\n")
    for name, concern in owner.items():
        info = CONCERNS[concern].model_fields[name]
        action = flags[name]
        assert info.description and info.description in action.help, name
        value = str(swarm_key) if name == "swarm_key" else other_value(name, info)
        if isinstance(value, bool):
            given = [f"--{'' if value else 'no-'}{name.replace('_', '-')}"]
        elif isinstance(value, list):
            given = [action.option_strings[0], *value]
        else:
            given = [action.option_strings[0], json.dumps(value) if isinstance(value, dict) else str(value)]
        got = getattr(getattr(settings_from_args(parser.parse_args(given)), concern), name)
        assert got != info.get_default(call_default_factory=True), (name, given)
        assert got == value or str(got) == str(value) or float(got) == float(value), (name, given, got)


def test_the_first_screen_of_help_lists_the_everyday_settings_only():
    out = subprocess.run(
        [sys.executable, "-m", "sapo.node.cli", "start", "--help"], capture_output=True, text=True, check=True
    ).stdout
    first_group_end = out.index(f"\n{settings_groups()[1][0]}:")
    first_screen = out[:first_group_end]
    options = re.findall(r"^  (--?[a-z][\w-]*)", first_screen, flags=re.MULTILINE)
    assert len(options) <= 25 and "--model" in options and "--peers" in options, options
    assert "--mesh-degree" not in first_screen and "--off-policy-rows" not in first_screen
    for title, _ in settings_groups():
        assert f"\n{title}:" in out
    assert out.startswith("usage: sapo-node start [-h] [--config FILE]")  # not 90 options in the usage line
