"""What the screen's redraws (eb83575) cost a node whose inbox an attacker fills: groups
screened a round, tokens forwarded and seconds, with SCREEN_REDRAWS as shipped (2) and as
before (0), on a warm-started tiny policy; with --smollm2, one heavy group on SmolLM2-135M.

The attacker's groups pass the intake: right answers under the node's own verifier, 64
completions (the codec's limit) of about 3.9 KB each (the group under the 256 KiB payload cap),
63 of them right, so 63 winners the screen measures, each truncated to max_new_tokens.

    nice -n 5 .venv/bin/python -m tests.screen_attacks.redraw_cost [--smollm2 MODELS_DIR]

A measurement for /work/attack-redraw.md, not a test.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from sapo.node.core import node as node_module
from sapo.node.core.state import RandomStreams
from sapo.sampling.screen import winning
from sapo.training.learning.typicality import excess_surprise
from sapo.training.learning.warmstart import WarmStartSettings, warm_start
from sapo.training.models.policy import load_policy
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs
from tests.support.screen_rounds import group, heavy, node_holding, one_round


def tokens(policy, groups: list[QuestionGroup], limit: int) -> int:
    """Tokens the screen measures (outside the answers) of the groups' winning completions."""
    return sum(len(row) for g in excess_surprise(policy, winning(groups), limit) for row in g)


def timed_round(policy, inbox, own, redraws: int, limit: int, j: int, seed: int) -> tuple[int, int, float]:
    node_module.SCREEN_REDRAWS = redraws  # read by Node.screen at each call
    with tempfile.TemporaryDirectory() as tmp:
        node = node_holding(policy, inbox, Path(tmp), limit, j)
        state = node.start_state().model_copy(update={"streams": RandomStreams.from_seed(seed)})
        started = time.perf_counter()
        screening = one_round(node, state, own)
        seconds = time.perf_counter() - started
    return len(screening.selection.external), len(screening.kept), seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smollm2", type=Path, help="a models dir holding smollm2-135m: time one heavy group on it")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("-j", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)
    tasks = default_task_specs(["basic_arithmetic"])
    problems = TaskSampler(tasks, dataset_seed=5, rng_seed=5).sample(40)
    with tempfile.TemporaryDirectory() as models:
        policy = load_policy("tiny", device="cpu", seed=0, models_dir=Path(models))
    warm_start(policy, tasks, WarmStartSettings(steps=150))  # so its bar refuses junk
    limit, j = args.max_new_tokens, args.j
    own = [group(p, "local") for p in problems[:2]]
    attackers = [heavy(p, f"mallory-{k}", rng) for k, p in enumerate(problems[2:26])]
    payload = max(len("".join(g.completions).encode()) for g in attackers)
    print(f"heavy group: 64 completions, {payload} bytes of text; what screening one costs:")
    samples = (("honest (8, 4 winners)", group(problems[0], "alice")), ("heavy (64, 63 winners)", attackers[0]))
    for label, sample in samples:
        started = time.perf_counter()
        count = tokens(policy, [sample], limit)
        print(f"  {label}: {count} tokens, {time.perf_counter() - started:.3f} s (tiny, 1 thread)")
    honest = [group(p, f"honest-{k % 4}") for k, p in enumerate(problems[26:38])]
    for name, inbox in {"attackers only (24 keys)": attackers, "4 honest x 3 + 24 keys": honest + attackers}.items():
        for redraws in (0, 2):
            runs = [timed_round(policy, inbox, own, redraws, limit, j, seed) for seed in range(3)]
            screened = sum(r[0] for r in runs) / len(runs)
            kept = sum(r[1] for r in runs) / len(runs)
            seconds = sorted(r[2] for r in runs)[len(runs) // 2]
            print(
                f"inbox of {name}, J={j}, SCREEN_REDRAWS={redraws}: groups screened {screened:.2f}/round, "
                f"kept {kept:.2f}, screen median {seconds:.2f} s (tiny, 1 thread)"
            )
    if args.smollm2:
        big = load_policy("smollm2-135m", device="cpu", seed=0, models_dir=args.smollm2)
        for label, sample in samples:
            started, cpu = time.perf_counter(), time.process_time()
            count = tokens(big, [sample], limit)
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            print(f"smollm2 {label}: {count} tokens, {wall:.1f} s wall, {cpu:.1f} s CPU")


if __name__ == "__main__":
    main()
