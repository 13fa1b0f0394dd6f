"""The verifier: a completion's reward is this node's own score of its last <answer> block.

Every completion a node scores may be a stranger's: its peers' groups, and the judge's answers.
So the answer goes through the task's strict grammar and scorer (training/problems/task_scorers.py),
never through reasoning-gym's own `score_answer`, and inside `untrusted_text()`, which refuses
any attempt to run code, start a process, open a socket or a file while it is scored.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from sapo.training.problems.task_scorers import SCORERS
from sapo.training.problems.tasks import Problem
from sapo.training.problems.untrusted import untrusted_text

log = logging.getLogger("sapo.rewards")

# (problem, completions) -> one reward each: this node's own judgement of its completions
Verifier = Callable[[Problem, list[str]], list[float]]

_OPEN, _CLOSE = "<answer>", "</answer>"

# An answer may stand between a few plain spaces or newlines inside its tag, as models write it.
# More, or any other whitespace, is text the grammar never reads and the screen skips (it leaves
# out the tag's content): room for a payload, so such an answer scores 0.
PADDING = " \t\n\r"
MAX_PADDING = 4

# The score of an answer the verifier accepts outright; anything less is partial credit.
FULL_CREDIT = 1.0


def is_correct(score: float) -> bool:
    return score >= FULL_CREDIT


def answer_span(completion: str) -> tuple[int, int] | None:
    """Where the content of the last complete <answer>...</answer> block lies, unstripped; None if
    there is none.

    The blocks are those of a left-to-right, non-greedy scan (what `re.findall` of
    `<answer>(.*?)</answer>` finds), in one linear pass: that regex retries from every opening
    tag, so 2,000 unclosed tags in a 16 KB completion cost it 145 ms.
    """
    found = None
    position = 0
    while True:
        start = completion.find(_OPEN, position)
        if start < 0:
            break
        end = completion.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            break
        found = (start + len(_OPEN), end)
        position = end + len(_CLOSE)
    return found


def extract_answer(completion: str) -> str | None:
    """The text inside the last complete <answer>...</answer> block, stripped; None if absent."""
    span = answer_span(completion)
    return None if span is None else completion[span[0] : span[1]].strip()


def has_answer_tag(completion: str) -> bool:
    return extract_answer(completion) is not None


def bounded_answer(problem: Problem, completion: str) -> str | None:
    """The answer the task's scorer may read: the last answer block's content, between at most
    `MAX_PADDING` spaces or newlines on each side, within the task's length cap; else None."""
    span = answer_span(completion)
    scorer = SCORERS.get(problem.spec.dataset)
    if span is None or scorer is None:
        return None
    content = completion[span[0] : span[1]]
    answer = content.strip(PADDING)
    leading = len(content) - len(content.lstrip(PADDING))
    trailing = len(content) - len(answer) - leading
    if max(leading, trailing) > MAX_PADDING or len(answer) > scorer.cap(problem):
        return None
    return answer


def score_completion(problem: Problem, completion: str) -> float:
    """The task's score of the extracted answer, in [0, 1]; partial credit passes through.

    A missing tag, more than `MAX_PADDING` spaces or newlines around the answer, an answer over
    the task's length cap (`bounded_answer`), and an answer outside the task's grammar all score 0
    without parsing further. Nothing here raises: a scorer that fails (a bug, or an audit event
    refused) has rejected the answer, and says so in the log.
    """
    answer = bounded_answer(problem, completion)
    if answer is None:
        return 0.0
    scorer = SCORERS[problem.spec.dataset]
    try:
        with untrusted_text():
            score = float(scorer.score(problem, answer))
    except Exception as exc:  # noqa: BLE001 - fail closed: no answer is right by crashing its scorer
        log.warning("scoring a %s answer failed (scored 0): %s: %s", problem.spec.dataset, type(exc).__name__, exc)
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
