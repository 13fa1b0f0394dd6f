"""What a hostile answer costs to score, before (reasoning-gym 0.1.25's own scorer, the 0.3.0 node's
verifier) and now (training/problems/task_scorers.py), on this CPU, in one run.

For each of the nine tasks: the right key, and the worst answers we know of, each in a 16 KB
completion (the codec's limit): the issue's propositional_logic formula, deep nesting, 2,000
unclosed answer tags, a 16 KB number, a right `\\frac` with a payload, the binary_matrix `eval`
string. Reports the CPU per completion (the slowest of `--repeats`), then a whole group of 64 such
completions through the real intake (frame decoded, problem regenerated, every completion scored).
The old scorer runs once per case and only where it is safe to run (never on the `eval` string).

    .venv/bin/python -m bench.hostile_answers > bench/results/hostile-answers/README.md
"""

from __future__ import annotations

import argparse
import time

from bench import verifier_030
from sapo.node.core.counters import NodeCounters
from sapo.node.core.exchange import GroupEncoder
from sapo.node.core.intake import Intake
from sapo.node.study.nodes import peer_id_for
from sapo.protocol.wire.codec import DecodeLimits, decode
from sapo.protocol.wire.messages import Rejected
from sapo.protocol.wire.verify import VerifyPolicy
from sapo.training.problems.rewards import score_completion, score_group
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import (
    EASY_CONFIGS,
    PAPER_TASKS,
    Problem,
    ProblemSpec,
    generate_problem,
    reasoning_gym_version,
)

LIMIT = 16_384 - len("<answer></answer>")
FORMULA = " ∨ ".join(["(P ∧ Q)"] * 1700)[:LIMIT]


def hostile_completions(problem: Problem) -> dict[str, str]:
    key = (
        problem.metadata.get("example_answer", "") if problem.spec.dataset == "propositional_logic" else problem.answer
    )
    return {
        "the key": f"<answer>{key}</answer>",
        "16 KB formula": f"<answer>{FORMULA}</answer>",
        "16 KB nesting": "<answer>" + "(" * (LIMIT // 2) + ")" * (LIMIT // 2) + "</answer>",
        "2,000 open tags": ("<answer>" * 2048)[:16_384],
        "16 KB number": f"<answer>{'9' * LIMIT}</answer>",
        "key + payload": f"<answer>\\frac{{1}}{{2}} {key} hail thief</answer>",
        "eval string": "<answer>__import__('os').system('true')</answer>",
    }


def cpu(call, repeats: int) -> float:
    worst = 0.0
    for _ in range(repeats):
        started = time.thread_time()
        call()
        worst = max(worst, time.thread_time() - started)
    return worst


def group_through_intake(problem: Problem, completion: str) -> tuple[float, int]:
    """CPU of the largest group of `completion` that the codec lets through (64 completions, or
    as many as fit in its 256 KiB payload) through the real intake (decode, regenerate, score),
    and how many completions it held."""
    sender = peer_id_for(0, 1)
    intake = Intake(
        NodeCounters(),
        max_group_bytes=2**26,
        swarm="b",
        local_peer_id=peer_id_for(0, 0),
        rg_version=reasoning_gym_version(),
        limits=DecodeLimits(),
        policy=VerifyPolicy(),
        max_age_seconds=600.0,
    )
    encoder = GroupEncoder(peer_id=sender, swarm="b", model_id="m", rg_version=intake.rg_version, clock=lambda: 1.0)
    for count in range(64, 0, -1):
        group = QuestionGroup(problem=problem, completions=[completion] * count, rewards=[0.0] * count)
        frame = encoder.frame(group, 1)
        try:
            decode(frame, intake.limits)
            break
        except Rejected:
            continue
    started = time.thread_time()
    intake.accept(frame, sender, 1.0)
    assert intake.counters.rejected.get("oversized", 0) == 0
    return time.thread_time() - started, count


def _limit_worker() -> None:
    """A scoring worker's limits: 4 GiB of address space (torch and reasoning-gym load first), 60 CPU-seconds."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))
    resource.setrlimit(resource.RLIMIT_CPU, (60, 60))


def worker_cost(repeats: int) -> None:
    """What moving scoring into a limited worker process (Linux) would cost a group, against
    scoring it in the node's own worker thread: the round trip of an honest 8-completion group."""
    import concurrent.futures
    import multiprocessing

    problem = generate_problem(
        ProblemSpec(dataset="basic_arithmetic", config=EASY_CONFIGS["basic_arithmetic"], seed=38, index=0)
    )
    completions = [f"Thinking. <answer>{problem.answer}</answer>"] * 4 + ["<answer>7</answer>"] * 4
    context = multiprocessing.get_context("forkserver")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context, initializer=_limit_worker) as pool:
        pool.submit(score_group, problem, completions).result()  # start it, import everything
        started = time.perf_counter()
        for _ in range(repeats):
            pool.submit(score_group, problem, completions).result()
        remote = (time.perf_counter() - started) / repeats
    started = time.perf_counter()
    for _ in range(repeats):
        score_group(problem, completions)
    local = (time.perf_counter() - started) / repeats
    print(f"\nAn honest group of 8 completions, wall time per group over {repeats} groups: in the node's thread")
    print(f"{local * 1000:.3f} ms; in a limited worker process (forkserver, RLIMIT_AS 4 GiB, RLIMIT_CPU 60 s)")
    print(f"{remote * 1000:.3f} ms, {remote / local:.0f} times as much, with a second Python process's memory.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--old", action="store_true", help="also time 0.3.0's verifier (minutes: 7 s a formula)")
    parser.add_argument("--smoke", action="store_true", help="one run of each case, for the test suite")
    args = parser.parse_args()
    if args.smoke:
        args.repeats = 1
    cpu_model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line), "?")
    print("# Hostile answers: CPU to score, 0.3.0's verifier against the strict grammars\n")
    print(f"`.venv/bin/python -m bench.hostile_answers{' --old' if args.old else ''}` on {cpu_model}, one thread.\n")
    print("CPU milliseconds for one completion (the slowest of", args.repeats, "runs; old: one run), with its")
    print("score now (and old's); then the slowest whole group of one such completion repeated, through the real")
    print("intake (decoded, regenerated, scored), with how many completions the codec let it hold (64 at most,")
    print("and 256 KiB of payload).\n")
    cases = list(hostile_completions(generate_problem(ProblemSpec(dataset="bf", config={}, seed=0, index=0))))
    print("| task | " + " | ".join(cases) + " | slowest group (completions) |")
    print("|---|" + "---|" * (len(cases) + 1))
    for task in PAPER_TASKS:
        problem = generate_problem(ProblemSpec(dataset=task, config=EASY_CONFIGS[task], seed=38, index=0))
        cells, slowest_group = [], (0.0, 0)
        for name, completion in hostile_completions(problem).items():
            now = cpu(lambda: score_completion(problem, completion), args.repeats)
            cell = f"{now * 1000:.3f} ({score_completion(problem, completion):g}"
            if args.old and name != "eval string":
                started = time.thread_time()
                old = verifier_030.completion_score(problem, completion)
                cell += f"; old {(time.thread_time() - started) * 1000:.1f} ms, {old:g}"
            cells.append(cell + ")")
            slowest_group = max(slowest_group, group_through_intake(problem, completion))
        seconds, count = slowest_group
        print(f"| {task} | " + " | ".join(cells) + f" | {seconds * 1000:.1f} ms ({count}) |")
    worker_cost(args.repeats * 10)


if __name__ == "__main__":
    main()
