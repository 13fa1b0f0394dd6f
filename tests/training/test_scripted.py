"""The scripted solver: a generate-only peer that is right with a set probability."""

from sapo.training.completions.scripted import ScriptedSolver
from sapo.training.problems.tasks import TaskSampler, default_task_specs


def test_scripted_solver_accuracy():
    problems = TaskSampler(default_task_specs(["basic_arithmetic"]), 0, 0).sample(5)
    assert {r for g in ScriptedSolver(1.0).generate_groups(problems, 4).groups for r in g.rewards} == {1.0}
    assert {r for g in ScriptedSolver(0.0).generate_groups(problems, 4).groups for r in g.rewards} == {0.0}
