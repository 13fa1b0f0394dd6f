"""The verifier of sapo 0.3.0 and every release before it, kept for comparisons only.

It is reasoning-gym 0.1.25's own `score_answer` on the last `<answer>` block (found by the regex
0.3.0 used), its prints swallowed, a crash or a non-finite score 0, clamped to [0, 1]. The node no
longer runs it (issue #38): binary_matrix's scorer `eval`s any answer that is not the key. Give it
only text you wrote or your own model sampled, and wrap it in `untrusted_text()` where that text
is a model's. Used by bench/poisoning.py (`--verifier reasoning-gym`), bench/hostile_answers.py
(`--old`), bench/scoring_equivalence.py and tests/training/test_task_scorers.py.
"""

from __future__ import annotations

import contextlib
import io
import math
import re

from sapo.training.problems.tasks import Problem, dataset_for

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def answer_score(problem: Problem, answer: str) -> float:
    """reasoning-gym's score of an answer already taken out of its tag."""
    entry = {"question": problem.question, "answer": problem.answer, "metadata": problem.metadata}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            score = float(dataset_for(problem.spec).score_answer(answer, entry))
    except Exception:  # noqa: BLE001 - as 0.3.0 did: a scorer that chokes has rejected the answer
        return 0.0
    return min(1.0, max(0.0, score)) if math.isfinite(score) else 0.0


def completion_score(problem: Problem, completion: str) -> float:
    """0.3.0's score of a whole completion: 0 without a complete answer block."""
    blocks = ANSWER.findall(completion)
    return answer_score(problem, blocks[-1].strip()) if blocks else 0.0
