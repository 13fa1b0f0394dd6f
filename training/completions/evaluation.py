"""Held-out accuracy: answers to a fixed set of questions, scored by full credit only.

Every node of a swarm is asked the same questions (a dataset seed no node samples from), so
their accuracies compare; partial credit (0.25 for a trivial propositional_logic conclusion) is
not accuracy, so only a score of 1 counts. Greedy pass@1 is one answer per question; sampled
pass@1 is the full-credit fraction of K answers per question at the training temperature (what
the node would answer when sampling, with less noise than one sample).
"""

from __future__ import annotations

from dataclasses import dataclass

from sapo.training.completions.generation import greedy_completions, sample_completions
from sapo.training.models.policy import Policy
from sapo.training.problems.rewards import is_correct, score_completion
from sapo.training.problems.tasks import Problem, TaskSampler, TaskSpec

HELDOUT_DATASET_SEED = 999_999_937
# Sequences decoded at once: a batch's KV cache grows with it (SmolLM2-135M: about 46 KB a
# token), so a set of hundreds of questions is answered in slices of this many sequences.
EVAL_BATCH_SEQUENCES = 64


@dataclass(frozen=True)
class HeldOutScores:
    greedy: dict[str, float]  # per task: the fraction of questions whose greedy answer earns full credit
    sampled: dict[str, float] | None  # per task: the full-credit fraction of K sampled answers; None if K = 0


def heldout_problems(
    tasks: list[TaskSpec], per_task: int, dataset_seed: int = HELDOUT_DATASET_SEED
) -> dict[str, list[Problem]]:
    """The same `per_task` questions of each task for every node (indices 0.. of the held-out seed)."""
    return {t.name: TaskSampler([t], dataset_seed=dataset_seed, rng_seed=0).sample(per_task) for t in tasks}


def heldout_scores(
    policy: Policy,
    problems: dict[str, list[Problem]],
    max_new_tokens: int,
    *,
    samples: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
) -> HeldOutScores:
    """Greedy pass@1 per task, and with `samples` > 0 sampled pass@1 over that many answers."""
    flat = [(task, p) for task, ps in problems.items() for p in ps]
    prompts = [policy.prompt(p) for _, p in flat]
    greedy: list[str] = []
    for start in range(0, len(prompts), EVAL_BATCH_SEQUENCES):
        greedy += greedy_completions(policy, prompts[start : start + EVAL_BATCH_SEQUENCES], max_new_tokens)
    sampled: list[list[str]] = []
    if samples:
        per_batch = max(1, EVAL_BATCH_SEQUENCES // samples)
        for batch, start in enumerate(range(0, len(prompts), per_batch)):
            texts, _, _ = sample_completions(
                policy,
                prompts[start : start + per_batch],
                num_generations=samples,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed + batch,
            )
            sampled += texts
    return HeldOutScores(
        greedy=_per_task(flat, [[text] for text in greedy]),
        sampled=_per_task(flat, sampled) if samples else None,
    )


def _per_task(flat: list[tuple[str, Problem]], answers: list[list[str]]) -> dict[str, float]:
    """Per task, the full-credit fraction of all the answers to its questions."""
    correct: dict[str, list[bool]] = {}
    for (task, problem), texts in zip(flat, answers):
        correct.setdefault(task, []).extend(is_correct(score_completion(problem, text)) for text in texts)
    return {task: sum(hits) / len(hits) for task, hits in correct.items() if hits}


def heldout_accuracy(policy: Policy, problems: dict[str, list[Problem]], max_new_tokens: int) -> dict[str, float]:
    """Greedy pass@1 per task (`heldout_scores` without samples)."""
    return heldout_scores(policy, problems, max_new_tokens).greedy
