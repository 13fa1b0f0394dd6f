"""Held-out accuracy at the start of a study's runs: round 0, before any update. `sapo-node
experiment` evaluates every --eval-every rounds, never before the first, so a study's summary
starts its held-out curve at round --eval-every. This builds a run exactly as the study does
(the same flags, nodes and held-out questions) and evaluates each of its nodes before it trains.

    .venv/bin/python -m bench.study_start --model tiny --nodes 2 --configs 8/0 --eval-every 5
    .venv/bin/python -m bench.study_start FLAGS --json ROWS    # FLAGS: the study's own, verbatim

Every node of seed 0's first arm is evaluated; with LoRA (an adapter starts at zero) or a shared
warm start they all start as one model, so the nodes' values agree and stand for every run.
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from sapo.node.cli import build_parser
    from sapo.node.core.settings import SettingsError
    from sapo.node.study.cli import study_settings
    from sapo.node.study.nodes import build_run
    from sapo.node.study.settings import parse_configs
    from sapo.training.models.devices import configure_torch_threads

    argv = list(sys.argv[1:] if argv is None else argv)
    json_out = None
    if "--json" in argv:
        at = argv.index("--json")
        json_out = Path(argv[at + 1])
        del argv[at : at + 2]
    args, node_args = build_parser().parse_known_args(["experiment", *argv])
    args.node_args = node_args
    try:
        study, base, _ = study_settings(args)
        if not base.run.eval_every:
            raise SettingsError("--eval-every is 0: the study has no held-out questions to start from")
    except SettingsError as error:
        print(f"study_start.py: {error}", file=sys.stderr)
        return 2
    configure_torch_threads(base.model.torch_threads)
    config = parse_configs(study.configs)[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run = build_run(base, study, config, 0, Path(tmp))
        scores = [learner.node.evaluate() for learner in run.learners]
    per_node = [s.greedy for s in scores]
    row = {
        "model": base.model.model,
        "config": config.name,
        "seed": 0,
        "round": 0,
        "heldout": per_node,  # per node, per task
        "heldout_sampled": [s.sampled for s in scores],  # per node, per task (None without --eval-samples)
        "samples_per_question": base.run.eval_samples,
        "questions_per_task": base.run.eval_questions,
        "seconds": time.perf_counter() - started,
        "command": "bench/study_start.py " + shlex.join(argv),
    }
    for k, accuracy in enumerate(per_node):
        sampled = scores[k].sampled or {}
        print(
            f"node {k}: "
            + ", ".join(
                f"{task} {value:.3f}" + (f" (sampled {sampled[task]:.3f})" if task in sampled else "")
                for task, value in accuracy.items()
            )
        )
    if json_out is not None:
        with json_out.open("a") as out:
            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
