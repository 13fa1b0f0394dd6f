"""A scripted solver: a policy-like generator that answers correctly with probability p.

It stands in for a strong (or weak) peer in experiments: its completions are plain
`<answer>…</answer>` texts, scored by the same verifier and, once shared, checked by the
receivers like any model's. A wrong answer is a near miss of the key (a nearby number, or the key
with one character changed), so it is really wrong rather than empty.
"""

from __future__ import annotations

import random
import time

from sapo.training.completions.generation import GenerationResult
from sapo.training.problems.rewards import score_group
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import Problem


def wrong_answer(answer: str, rng: random.Random) -> str:
    try:
        value = int(answer)
    except ValueError:
        if not answer:
            return "?"
        i = rng.randrange(len(answer))
        return answer[:i] + ("x" if answer[i] != "x" else "y") + answer[i + 1 :]
    return str(value + rng.choice([-3, -2, -1, 1, 2, 3]))


class ScriptedSolver:
    def __init__(self, accuracy: float, seed: int = 0, model_id: str = "scripted"):
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"solver accuracy must be in [0, 1], got {accuracy}")
        self.accuracy = accuracy
        self.model_id = f"{model_id}-p{accuracy:g}"
        self.rng = random.Random(seed)

    def complete(self, problem: Problem) -> str:
        correct = self.rng.random() < self.accuracy
        return f"<answer>{problem.answer if correct else wrong_answer(problem.answer, self.rng)}</answer>"

    def generate_groups(self, problems: list[Problem], num_generations: int, sender_round: int = 0) -> GenerationResult:
        started = time.perf_counter()
        now = time.time()
        groups = []
        for problem in problems:
            texts = [self.complete(problem) for _ in range(num_generations)]
            groups.append(
                QuestionGroup(
                    problem=problem,
                    completions=texts,
                    rewards=score_group(problem, texts),
                    model_id=self.model_id,
                    sender_round=sender_round,
                    created_at=now,
                )
            )
        return GenerationResult(groups, time.perf_counter() - started, 0)
