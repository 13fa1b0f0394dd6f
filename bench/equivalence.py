"""Does a faster generation/update path learn the same? The learning test's run, on two source trees.

The run is tests/training/test_learning.py's: a tiny model warm-started with 30 % of its targets
tagged, then GRPO rounds on easy addition (8 questions x 8 samples, 24 tokens, lr 1e-4, the
node's default 2 x 2 clipped steps). Each seed runs once per tree, in its own process, with
`sapo` imported from that tree, so the only difference is the code:

    git worktree add /tmp/sapo-before <commit>          # the tree to compare against
    .venv/bin/python bench/equivalence.py --before /tmp/sapo-before --seeds 4
    .venv/bin/python bench/equivalence.py --before /tmp/sapo-before --generation-precision bf16
    .venv/bin/python bench/equivalence.py --before /tmp/sapo-before --after-precision bf16

`--generation-precision` is given to the trees whose `load_policy` takes it (the decoding
precision, training/policy.py); an older tree without it samples in fp32, and says so.
`--precision` is the update's precision in both trees, `--after-precision` in the tree under
test alone (a bf16 update against the fp32 one before it).

Sampling draws from a different random stream when the decoding loop changes, so single runs
differ token by token; what must agree is the learning, seed-paired: the mean sampled reward over
the rounds and the held-out greedy accuracy at the end (`heldout_accuracy`, the node's own
evaluator: full credit only; before this bench used it, the greedy figure was a mean score). Printed: both per seed, their paired
differences, and the mean difference with its standard error.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RESULT_MARKER = "EQUIVALENCE_RESULT "
PACKAGES = ("node", "protocol", "sampling", "training")
HERE = Path(__file__).resolve().parent.parent


def run_worker(seed: int, rounds: int, generation_precision: str, precision: str) -> dict:
    import inspect
    import random

    import torch

    from sapo.training.config import TrainingSettings
    from sapo.training.evaluation import heldout_accuracy, heldout_problems
    from sapo.training.generation import generate_groups
    from sapo.training.policy import load_policy
    from sapo.training.tasks import TaskSampler, default_task_specs
    from sapo.training.update import grpo_update, make_optimizer
    from sapo.training.warmstart import WarmStartSettings, warm_start

    try:  # trees since the round's rows became a value (sampling/training_set.py) train on rows
        from sapo.sampling.external_use import ExternalUse
        from sapo.sampling.training_set import training_set

        def trained(groups):
            return training_set(groups, [], ExternalUse(), policy.tokenizer_fingerprint).rows
    except ImportError:  # older trees train on the groups themselves

        def trained(groups):
            return groups

    torch.set_num_threads(1)
    (spec,) = default_task_specs(["basic_arithmetic"])
    tasks = [spec.model_copy(update={"config": {**spec.config, "operators": ["+"]}})]
    options = {"precision": precision}
    if "generation_precision" in inspect.signature(load_policy).parameters:
        options["generation_precision"] = generation_precision
    with tempfile.TemporaryDirectory() as models:
        policy = load_policy("tiny", device="cpu", seed=seed, models_dir=Path(models), **options)
    sampled_in = "bf16" if getattr(policy, "generation_bf16", False) else "fp32"
    warm_start(policy, tasks, WarmStartSettings(steps=300, tag_rate=0.3, seed=seed))
    heldout = heldout_problems(tasks, 128, dataset_seed=999)
    before = heldout_accuracy(policy, heldout, max_new_tokens=24)["basic_arithmetic"]
    settings = TrainingSettings(lr=1e-4, max_new_tokens=24, generations=8)
    optimizer = make_optimizer(policy, settings)
    sampler = TaskSampler(tasks, dataset_seed=1 + seed, rng_seed=1 + seed)
    rng = random.Random(seed)
    rewards = []
    for round_index in range(1, rounds + 1):
        generation = generate_groups(policy, sampler.sample(8), num_generations=8, max_new_tokens=24, seed=round_index)
        batch = [r for g in generation.groups for r in g.rewards]
        rewards.append(sum(batch) / len(batch))
        grpo_update(policy, optimizer, trained(generation.groups), settings, rng)
    after = heldout_accuracy(policy, heldout, max_new_tokens=24)["basic_arithmetic"]
    return {
        "seed": seed,
        "sampled_mean": statistics.fmean(rewards),
        "greedy_before": before,
        "greedy_after": after,
        "generation": sampled_in,
        "update": "bf16" if policy.bf16 else "fp32",
    }


def tree_path(tree: Path) -> Path:
    """A directory holding `sapo/<package>` links into `tree`, to put first on sys.path."""
    root = Path(tempfile.mkdtemp(prefix="sapo-tree-"))
    (root / "sapo").mkdir()
    for package in PACKAGES:
        (root / "sapo" / package).symlink_to(tree.resolve() / package)
    return root


def run_tree(tree: Path, seed: int, rounds: int, generation_precision: str, precision: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree_path(tree)))
    command = [
        sys.executable,
        __file__,
        "--worker",
        str(seed),
        "--rounds",
        str(rounds),
        "--generation-precision",
        generation_precision,
        "--precision",
        precision,
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    raise RuntimeError(f"{tree} seed {seed} failed:\n{done.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="source tree to compare against (a git worktree)")
    parser.add_argument("--after", type=Path, default=HERE, help="source tree under test (default: this one)")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--generation-precision",
        choices=("auto", "fp32", "bf16"),
        default="fp32",
        help="decoding precision, for trees that have the setting (default fp32: the code alone differs)",
    )
    parser.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="fp32",
        help="the update's precision in both trees (default fp32: the code alone differs)",
    )
    parser.add_argument(
        "--after-precision",
        choices=("auto", "fp32", "bf16"),
        default=None,
        help="the update's precision in the tree under test (default: --precision)",
    )
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        import sapo.training

        assert sapo.training.__path__, "sapo not importable"
        print(
            RESULT_MARKER
            + json.dumps(
                run_worker(args.worker, args.rounds, args.generation_precision, args.precision)
                | {"tree": str(Path(sapo.training.__path__[0]).resolve().parent)}
            ),
            flush=True,
        )
        return 0
    if args.before is None:
        parser.error("--before TREE is required")
    rows = []
    for seed in range(args.seeds):
        before = run_tree(args.before, seed, args.rounds, args.generation_precision, args.precision)
        after = run_tree(
            args.after, seed, args.rounds, args.generation_precision, args.after_precision or args.precision
        )
        if seed == 0:
            print(
                f"sampling precision: {before['generation']} (before), {after['generation']} (after); update "
                f"precision: {before['update']} (before), {after['update']} (after)",
                flush=True,
            )
        rows.append((seed, before, after))
        print(
            f"seed {seed}: sampled mean {before['sampled_mean']:.3f} -> {after['sampled_mean']:.3f}   "
            f"greedy {before['greedy_before']:.3f}->{before['greedy_after']:.3f} (before)  "
            f"{after['greedy_before']:.3f}->{after['greedy_after']:.3f} (after)",
            flush=True,
        )
    for key in ("sampled_mean", "greedy_after"):
        diffs = [a[key] - b[key] for _, b, a in rows]
        mean = statistics.fmean(diffs)
        error = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        print(
            f"{key}: before {statistics.fmean(b[key] for _, b, _ in rows):.3f}, after "
            f"{statistics.fmean(a[key] for _, _, a in rows):.3f}, paired difference {mean:+.3f} ± {error:.3f} (s.e.)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
