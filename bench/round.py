"""Time one GRPO round (generate, score, encode + update) per model, on the same batch.

Each model runs in its own child process, so its peak RSS and its load time are its own.
The round is the node's round without the network: sample problems, generate G completions
each (`sample_completions`, as `generate_groups` does), score them with the task's verifier
(`score_group`), then `grpo_update` (which re-encodes the text and takes the clipped steps).

    .venv/bin/python bench/round.py                      # tiny and smollm2-135m, the defaults
    .venv/bin/python bench/round.py --models tiny --rounds 3 --no-lora
    .venv/bin/python bench/round.py --smoke              # tiny only, tiny sizes, < 20 s

A round whose groups all have equal rewards has nothing to learn, and `grpo_update` skips it
(a random-weight tiny model scores 0 everywhere). With `--force-signal` (the default) such
groups get alternating 0/1 rewards before the update, so every model pays for a full update
on every group: the timing is the worst case, not an accident of what was sampled. The real
reward mean and the number of groups with real signal are printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

RESULT_MARKER = "BENCH_ROUND_RESULT "
DEFAULT_MODELS_DIR = Path(__file__).resolve().parent / ".cache" / "models"
TASK = "basic_arithmetic"  # its easy settings (training.tasks.EASY_CONFIGS): SmolLM2 scores here


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,smollm2-135m", help="comma-separated model names")
    parser.add_argument("--questions", type=int, default=4, help="questions per round")
    parser.add_argument("--generations", type=int, default=8, help="G: completions per question")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="generation cap per completion")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per model; the first is a warm-up if > 1")
    parser.add_argument(
        "--lora",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train a LoRA adapter (r=16) rather than the full model (default: LoRA, as `make run`)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is what a node sharing a CPU uses)")
    parser.add_argument("--seed", type=int, default=0, help="model, task and sampling seed (same for every model)")
    parser.add_argument(
        "--force-signal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="give all-equal-reward groups alternating 0/1 rewards so the update is never skipped",
    )
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR, help="converted-model cache")
    parser.add_argument("--smoke", action="store_true", help="tiny only, tiny sizes: a quick check that this runs")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # one model, in a child process
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.questions, args.generations, args.max_new_tokens, args.rounds = "tiny", 2, 4, 16, 2
    for name in ("questions", "generations", "max_new_tokens", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


# --- the child: one model ----------------------------------------------------------------------


def peak_rss_mb() -> float:
    """Peak RSS since the last `reset_peak_rss` (Linux VmHWM), else since process start."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> bool:
    """Linux lets a process reset its own VmHWM; then the round's peak excludes loading."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def run_model(args: argparse.Namespace, model: str) -> dict:
    import random

    import torch

    from sapo.training.config import TrainingSettings, default_learning_rate
    from sapo.training.generation import sample_completions
    from sapo.training.policy import LoraOptions, load_policy
    from sapo.training.rewards import score_group
    from sapo.training.rollouts import QuestionGroup
    from sapo.training.tasks import TaskSampler, default_task_specs
    from sapo.training.update import grpo_update, make_optimizer

    import peft  # noqa: F401 - imported here so that load time is loading, not importing
    import transformers  # noqa: F401

    torch.set_num_threads(args.threads)
    args.models_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    policy = load_policy(
        model,
        device="cpu",
        lora=LoraOptions() if args.lora else None,
        seed=args.seed,
        models_dir=args.models_dir,
    )
    load_seconds = time.perf_counter() - started
    load_peak = peak_rss_mb()
    settings = TrainingSettings(
        generations=args.generations,
        max_new_tokens=args.max_new_tokens,
        lr=default_learning_rate(model, args.lora),
    )
    optimizer = make_optimizer(policy, settings)
    update_rng = random.Random(args.seed)
    # Same dataset seed and rng for every model: every model answers the same questions.
    tasks = TaskSampler(default_task_specs([TASK]), dataset_seed=args.seed, rng_seed=args.seed)
    peak_is_round_only = reset_peak_rss()

    rounds = []
    for round_index in range(args.rounds):
        problems = tasks.sample(args.questions)
        t0 = time.perf_counter()
        prompts = [policy.prompt(p) for p in problems]
        completions, new_tokens = sample_completions(
            policy,
            prompts,
            num_generations=args.generations,
            max_new_tokens=args.max_new_tokens,
            temperature=settings.temperature,
            seed=args.seed * 1_000_003 + round_index,  # the node's per-round seed
        )
        t1 = time.perf_counter()
        rewards = [score_group(p, texts) for p, texts in zip(problems, completions)]
        t2 = time.perf_counter()
        real_signal = sum(1 for r in rewards if len(set(r)) > 1)
        real_mean = sum(map(sum, rewards)) / sum(map(len, rewards))
        if args.force_signal:
            rewards = [r if len(set(r)) > 1 else [float(i % 2) for i in range(len(r))] for r in rewards]
        groups = [
            QuestionGroup(problem=p, completions=texts, rewards=r, model_id=model, sender_round=round_index)
            for p, texts, r in zip(problems, completions, rewards)
        ]
        update = grpo_update(policy, optimizer, groups, settings, update_rng)
        t3 = time.perf_counter()
        rounds.append(
            {
                "generate_s": t1 - t0,
                "score_s": t2 - t1,
                "update_s": t3 - t2,
                "total_s": t3 - t0,
                "tokens": new_tokens,
                "update_skipped": update.skipped,
                "update_tokens": update.tokens,
                "real_reward_mean": real_mean,
                "real_signal_groups": real_signal,
            }
        )
        print(
            f"  [{model}] round {round_index}{' (warm-up)' if args.rounds > 1 and round_index == 0 else ''}: "
            f"generate {t1 - t0:.2f}s, score {t2 - t1:.3f}s, encode+update {t3 - t2:.2f}s, "
            f"{new_tokens} tokens, real reward {real_mean:.3f}, "
            f"{real_signal}/{len(groups)} groups with real signal",
            file=sys.stderr,
            flush=True,
        )
    timed = rounds[1:] if len(rounds) > 1 else rounds
    mean = {k: sum(r[k] for r in timed) / len(timed) for k in ("generate_s", "score_s", "update_s", "total_s", "tokens")}
    return {
        "model": model,
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "trainable": sum(p.numel() for p in policy.trainable_parameters()),
        "load_s": load_seconds,
        "load_peak_rss_mb": load_peak,
        "round_peak_rss_mb": peak_rss_mb(),
        "peak_is_round_only": peak_is_round_only,
        "timed_rounds": len(timed),
        "skipped_updates": sum(r["update_skipped"] for r in timed),
        "real_reward_mean": sum(r["real_reward_mean"] for r in timed) / len(timed),
        **mean,
        "tokens_per_s": mean["tokens"] / mean["generate_s"] if mean["generate_s"] > 0 else 0.0,
        "rounds": rounds,
    }


# --- the parent: one child per model, then the table ------------------------------------------


def run_child(args: argparse.Namespace, model: str, argv: list[str]) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", model]
    # stderr (progress lines, library warnings) passes straight through to ours.
    child = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    for line in child.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    raise SystemExit(f"benchmark of {model!r} failed (exit {child.returncode}); its output:\n{child.stdout}")


def print_table(args: argparse.Namespace, results: list[dict]) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print()
    print(
        f"GRPO round benchmark: {args.questions} questions x {args.generations} generations, "
        f"max_new_tokens={args.max_new_tokens}, task={TASK} (easy), "
        f"{'LoRA r=16' if args.lora else 'full fine-tuning'}, torch threads={args.threads}, seed={args.seed}"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"load average {load:.2f} at the end. Timings are CONTENDED when other jobs share the CPUs "
        f"(the load average says how much)."
    )
    timed = results[0]["timed_rounds"] if results else 0
    print(
        f"times are the mean of {timed} timed round(s)"
        f"{' after 1 warm-up round' if args.rounds > 1 else ' (no warm-up)'}; load time is not in the round."
        + (" Flat-reward groups got forced 0/1 rewards (--force-signal)." if args.force_signal else "")
    )
    columns = [
        ("model", "{model}"),
        ("params", "{parameters_m}"),
        ("load s", "{load_s:.1f}"),
        ("generate s", "{generate_s:.2f}"),
        ("score s", "{score_s:.3f}"),
        ("enc+update s", "{update_s:.2f}"),
        ("total s", "{total_s:.2f}"),
        ("tokens", "{tokens:.0f}"),
        ("tok/s", "{tokens_per_s:.1f}"),
        ("peak RSS MB (load)", "{load_peak_rss_mb:.0f}"),
        ("peak RSS MB (round)", "{round_peak_rss_mb:.0f}"),
        ("reward", "{real_reward_mean:.3f}"),
        ("skipped", "{skipped_updates}"),
    ]
    rows = [[h for h, _ in columns]]
    for r in results:
        fields = {**r, "parameters_m": f"{r['parameters'] / 1e6:.1f}M"}
        rows.append([fmt.format(**fields) for _, fmt in columns])
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    for n, row in enumerate(rows):
        print("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    if results and not all(r["peak_is_round_only"] for r in results):
        print("note: this OS cannot reset the peak RSS; 'round' peak includes loading")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        result = run_model(args, args.worker)
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    results = []
    for model in models:
        print(f"benchmarking {model} ...", file=sys.stderr, flush=True)
        results.append(run_child(args, model, argv))
    print_table(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
