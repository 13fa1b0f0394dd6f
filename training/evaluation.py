"""Held-out accuracy: greedy answers to a fixed set of questions, scored by full credit only.

Every node of a swarm is asked the same questions (a dataset seed no node samples from), so
their accuracies compare; partial credit (0.25 for a trivial propositional_logic conclusion) is
not accuracy, so only a score of 1 counts.
"""

from __future__ import annotations

from sapo.training.generation import greedy_completions
from sapo.training.policy import Policy
from sapo.training.rewards import is_correct, score_completion
from sapo.training.tasks import Problem, TaskSampler, TaskSpec

HELDOUT_DATASET_SEED = 999_999_937


def heldout_problems(
    tasks: list[TaskSpec], per_task: int, dataset_seed: int = HELDOUT_DATASET_SEED
) -> dict[str, list[Problem]]:
    """The same `per_task` questions of each task for every node (indices 0.. of the held-out seed)."""
    return {t.name: TaskSampler([t], dataset_seed=dataset_seed, rng_seed=0).sample(per_task) for t in tasks}


def heldout_accuracy(policy: Policy, problems: dict[str, list[Problem]], max_new_tokens: int) -> dict[str, float]:
    """Per task, the fraction of questions whose greedy answer earns full credit."""
    flat = [(task, p) for task, ps in problems.items() for p in ps]
    texts = greedy_completions(policy, [policy.prompt(p) for _, p in flat], max_new_tokens)
    correct: dict[str, list[bool]] = {task: [] for task in problems}
    for (task, problem), text in zip(flat, texts):
        correct[task].append(is_correct(score_completion(problem, text)))
    return {task: sum(hits) / len(hits) for task, hits in correct.items() if hits}
