"""`sapo-node experiment`: the controlled I/J study (node/study/README.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sapo.node.core.settings import NodeSettings
from sapo.node.flags import configure_logging, flag, node_settings_from_flags

if TYPE_CHECKING:
    from sapo.node.study.settings import ExperimentSettings


def experiment_node_flags(node_args: list[str]) -> list[str]:
    """Every study node's flags: the experiment's defaults, then the user's flags on top."""
    from sapo.node.study.settings import EXPERIMENT_NODE_DEFAULTS, EXPERIMENT_TINY_DEFAULTS
    from sapo.training.models.sources import is_tiny

    base = node_settings_from_flags([*EXPERIMENT_NODE_DEFAULTS, *node_args])
    if not is_tiny(base.model.model):
        return [*EXPERIMENT_NODE_DEFAULTS, *node_args]
    stand_in = list(EXPERIMENT_TINY_DEFAULTS)
    given = {flag.split("=")[0] for flag in node_args}
    if "--tasks" in given and "--task-config" not in given:  # the stand-in's config is for its own task
        at = stand_in.index("--task-config")
        del stand_in[at : at + 2]
    if "--lora" in given and "--warm-start-steps" not in given:  # the warm start trains the full model: not with LoRA
        at = stand_in.index("--warm-start-steps")
        del stand_in[at : at + 2]
    return [*EXPERIMENT_NODE_DEFAULTS, *stand_in, *node_args]


def experiment_node_settings(node_args: list[str]) -> NodeSettings:
    return node_settings_from_flags(experiment_node_flags(node_args))


def study_settings(args: argparse.Namespace) -> tuple[ExperimentSettings, NodeSettings, list[str]]:
    """`sapo-node experiment`'s settings from its parsed flags, checked before any model loads: the
    study's, every node's, and the node flags they came from (libp2p runs pass them on)."""
    from sapo.node.study.settings import ExperimentSettings

    node_flags = experiment_node_flags(args.node_args)
    base = node_settings_from_flags(node_flags)
    study = ExperimentSettings(
        **{name: getattr(args, name) for name in ExperimentSettings.model_fields if name in vars(args)}
    )
    from sapo.node.core.settings import SettingsError

    if study.shared_base and not base.model.lora:
        raise SettingsError("invalid settings:\n  --shared-base puts LoRA adapters on one base model; add --lora")
    if study.slices:
        if len(base.tasks.tasks) != 1:
            raise SettingsError(f"invalid settings:\n  --slices splits one task; --tasks names {base.tasks.tasks}")
        from sapo.node.study.nodes import slice_tasks

        for (task,) in slice_tasks(base, study):  # each slice's config must be one peers accept
            base.updated({"task_config": {task.name: task.config}})
    return study, base, node_flags


def cmd_experiment(args: argparse.Namespace) -> int:
    if getattr(args, "resummarize", None):
        from sapo.node.study.summary import resummarize

        summary = resummarize(Path(args.resummarize), int(args.ma_window) if getattr(args, "ma_window", None) else None)
        print(
            f"rewrote {args.resummarize}/summary.md, summary.json, curves.png over {summary['rounds_compared']} rounds"
        )
        return 0
    study, base, node_flags = study_settings(args)
    from sapo.node.study.experiment import StudyStopped, run_experiment
    from sapo.training.models.devices import configure_torch_threads

    configure_logging(base.run.log_level)
    configure_torch_threads(base.model.torch_threads)  # the runs this process does itself (--jobs 1)
    try:
        summary = run_experiment(study, base, node_flags)
    except StudyStopped as stopped:
        print(f"sapo-node: {stopped}", file=sys.stderr, flush=True)
        return 130
    print(
        f"wrote {study.out}/summary.md, summary.json, curves.png, raw.jsonl "
        f"in {summary['timing']['wall_seconds']:.0f}s",
        flush=True,
    )
    return 0


def add_commands(sub) -> None:
    from sapo.node.study.settings import ExperimentSettings

    experiment = sub.add_parser(
        "experiment",
        allow_abbrev=False,  # --seed must reach the nodes, not abbreviate --seeds
        help="run the controlled I/J study with all nodes in one process",
        description="Run every --configs arm for --seeds seeds with all nodes in one process, sharing "
        "through an in-memory exchange (the real codec and checks). Any other flag is a node setting "
        "for every node (see `sapo-node start --help`); defaults here: --model tiny-micro --torch-threads 1, and for "
        "tiny models the CPU stand-in: one-digit addition, --max-new-tokens 24, --warm-start-steps 2000 with "
        "--warm-start-answer-noise 0.6, --lr 3e-4, --eval-every 25 (docs/science.md: 'The testbed').",
    )
    for name, info in ExperimentSettings.model_fields.items():
        default = info.get_default(call_default_factory=True)
        help_text = f"{info.description} (default: {','.join(default) if isinstance(default, list) else default})"
        if info.annotation is bool:
            experiment.add_argument(
                flag(name), dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text
            )
        else:
            experiment.add_argument(flag(name), dest=name, default=argparse.SUPPRESS, help=help_text)
    experiment.set_defaults(func=cmd_experiment, takes_node_flags=True)
