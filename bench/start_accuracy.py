"""Where does a model start? Its accuracy on each ReasoningGYM task at the easy settings, before
any training: greedy (held-out questions, as the node's --eval-every measures) and sampled
(G completions at temperature 1, as a round samples them), full credit only.

A study shows learning only on a task where the model starts low but not at zero: at 0 every
group is flat and GRPO has nothing to learn from, near 1 there is nothing left to learn.
bench/gpu_check.py's short study uses the task this picks.

    .venv/bin/python -m bench.start_accuracy                          # smollm2-135m, the nine tasks
    .venv/bin/python -m bench.start_accuracy --tasks basic_arithmetic,bf --questions 8
    .venv/bin/python -m bench.start_accuracy --smoke                  # tiny, two tasks, seconds
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.text_table import print_rows

DEFAULT_MODELS_DIR = Path(__file__).resolve().parent / ".cache" / "models"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sapo.training.problems.tasks import PAPER_TASKS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="smollm2-135m", help="model name (smollm2-135m, a tiny variant, a local HF directory)"
    )
    parser.add_argument(
        "--tasks", default=",".join(PAPER_TASKS), help="comma-separated ReasoningGYM tasks (easy settings)"
    )
    parser.add_argument(
        "--task-config",
        type=json.loads,
        default={},
        help='JSON {task: {setting: value}} laid over the easy settings, e.g. \'{"basic_arithmetic": {"max_digits": 2}}\'',
    )
    parser.add_argument("--questions", type=int, default=8, help="held-out questions per task, answered greedily")
    parser.add_argument("--sampled-questions", type=int, default=4, help="questions per task sampled G times")
    parser.add_argument("--generations", type=int, default=8, help="G: samples per question")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="generation cap (the node's default)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR, help="converted-model cache")
    parser.add_argument("--json", type=Path, default=None, help="also write one JSON row per task here")
    parser.add_argument("--smoke", action="store_true", help="tiny model, two tasks, 2 questions, 8 tokens")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.tasks, args.questions, args.sampled_questions = "tiny", "basic_arithmetic,bf", 2, 1
        args.generations, args.max_new_tokens = 2, 8
    args.task_list = [t.strip() for t in args.tasks.split(",") if t.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from sapo.training.completions.evaluation import heldout_accuracy, heldout_problems, is_correct
    from sapo.training.completions.generation import sample_completions
    from sapo.training.models.policy import load_policy
    from sapo.training.problems.rewards import score_completion
    from sapo.training.problems.tasks import TaskSampler, default_task_specs

    torch.set_num_threads(args.threads)
    args.models_dir.mkdir(parents=True, exist_ok=True)
    policy = load_policy(args.model, device=args.device, seed=0, models_dir=args.models_dir)
    rows = []
    specs = [
        spec.model_copy(update={"config": {**spec.config, **args.task_config.get(spec.name, {})}})
        for spec in default_task_specs(args.task_list)
    ]
    for spec in specs:
        started = time.perf_counter()
        greedy = heldout_accuracy(policy, heldout_problems([spec], args.questions), args.max_new_tokens)[spec.name]
        problems = TaskSampler([spec], dataset_seed=0, rng_seed=0).sample(args.sampled_questions)
        completions, tokens, _ = sample_completions(
            policy,
            [policy.prompt(p) for p in problems],
            num_generations=args.generations,
            max_new_tokens=args.max_new_tokens,
        )
        scores = [score_completion(p, c) for p, group in zip(problems, completions) for c in group]
        sampled = sum(map(is_correct, scores)) / len(scores)
        with_answer = sum(1 for p, group in zip(problems, completions) for c in group if "</answer>" in c) / len(scores)
        # a group with both a right and a wrong answer is one GRPO can learn from
        mixed = sum(
            1
            for i in range(len(problems))
            if 0 < sum(map(is_correct, scores[i * args.generations : (i + 1) * args.generations])) < args.generations
        )
        rows.append(
            {
                "task": spec.name,
                "config": spec.config,
                "greedy": greedy,
                "sampled": sampled,
                "tagged": with_answer,
                "mixed_groups": mixed,
                "groups": len(problems),
                "tokens": tokens,
                "seconds": time.perf_counter() - started,
            }
        )
        print(
            f"  {spec.name}: greedy {greedy:.2f}, sampled {sampled:.2f}, {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    print(
        f"start accuracy of {args.model} at the easy settings{' with ' + json.dumps(args.task_config) if args.task_config else ''}: greedy on {args.questions} held-out questions, "
        f"sampled on {args.sampled_questions} x {args.generations} (temperature 1), up to {args.max_new_tokens} tokens"
    )
    table = [["task", "greedy", "sampled", "tagged", "mixed groups", "tokens", "s"]]
    table += [
        [
            r["task"],
            f"{r['greedy']:.2f}",
            f"{r['sampled']:.2f}",
            f"{r['tagged']:.2f}",
            f"{r['mixed_groups']}/{r['groups']}",
            str(r["tokens"]),
            f"{r['seconds']:.0f}",
        ]
        for r in rows
    ]
    print_rows(table)
    if args.json:
        args.json.write_text("".join(json.dumps({"model": args.model, **r}) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
