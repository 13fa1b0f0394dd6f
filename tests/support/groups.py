"""Honest rollout groups, as a peer that follows the protocol publishes them."""

from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs


def honest_group(index: int = 0) -> QuestionGroup:
    """An honest group on the `index`-th question: distinct indexes give distinct content, which
    the intake needs to accept more than one (it refuses a re-stamped copy as a repeat)."""
    problem = TaskSampler(default_task_specs(["basic_arithmetic"]), 77, 0).sample(index + 1)[index]
    return QuestionGroup(
        problem=problem, completions=[f"<answer>{problem.answer}</answer>", "<answer>x</answer>"], rewards=[1.0, 0.0]
    )
