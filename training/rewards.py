"""The verifier: a completion's reward is the task's own score of its last <answer> block."""

from __future__ import annotations

import contextlib
import io
import math
import re
from collections.abc import Callable

from sapo.training.tasks import Problem, dataset_for

# (problem, completions) -> one reward each: this node's own judgement of its completions
Verifier = Callable[[Problem, list[str]], list[float]]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

# The score of an answer the verifier accepts outright; anything less is partial credit.
FULL_CREDIT = 1.0


def is_correct(score: float) -> bool:
    return score >= FULL_CREDIT


def extract_answer(completion: str) -> str | None:
    """The text inside the last complete <answer>...</answer> block, stripped; None if absent."""
    matches = _ANSWER.findall(completion)
    if not matches:
        return None
    return matches[-1].strip()


def has_answer_tag(completion: str) -> bool:
    return extract_answer(completion) is not None


def score_completion(problem: Problem, completion: str) -> float:
    """ReasoningGYM's score_answer on the extracted answer, in [0, 1]; partial credit passes through.

    A missing tag scores 0 without asking the task: some verifiers (fraction_simplification)
    give a constant floor even to no answer, which would reward not answering at all.
    """
    answer = extract_answer(completion)
    if answer is None:
        return 0.0
    entry = {"question": problem.question, "answer": problem.answer, "metadata": problem.metadata}
    dataset = dataset_for(problem.spec)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            score = float(dataset.score_answer(answer, entry))
    except Exception:  # noqa: BLE001 - a verifier that chokes on odd text has rejected it
        return 0.0
    if not math.isfinite(score):
        return 0.0
    return min(1.0, max(0.0, score))


def score_group(problem: Problem, completions: list[str]) -> list[float]:
    """The task's own scores, partial credit included."""
    return [score_completion(problem, c) for c in completions]


def accept_group(problem: Problem, completions: list[str]) -> list[float]:
    """1 where the verifier accepts the answer (full credit), else 0: the paper's reward."""
    return [1.0 if is_correct(score) else 0.0 for score in score_group(problem, completions)]


def verifier_for(reward: str) -> Verifier:
    """`binary` (the paper's: 1 if the verifier accepts) or `partial` (the task's own score)."""
    return {"binary": accept_group, "partial": score_group}[reward]
