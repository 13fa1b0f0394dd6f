"""Issue #38: a Hypothesis fuzz of the scoring path, every one of the nine tasks, a few thousand
hostile answers each: code, deep nesting, huge numbers, 16 KB strings, any unicode, `\\frac`
prefixes with payloads, near misses of the key, unclosed and repeated tags. Zero side effects
(no file, process, socket, compile or import on the scoring thread; the guard refused nothing),
zero exceptions from any task's scorer, every score in [0, 1]. The slowest completion per task is
printed (`-s`); bench/hostile_answers.py measures the same cases outside the test runner."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapo.training.problems import untrusted
from sapo.training.problems.rewards import bounded_answer, score_completion
from sapo.training.problems.task_scorers import SCORERS
from sapo.training.problems.tasks import EASY_CONFIGS, PAPER_TASKS, Problem, ProblemSpec, generate_problem
from tests.support.hostile_answers import code_execution_answers, witness
from tests.support.task_configs import CONFIGS, right_answer

EXAMPLES_PER_TASK = 2000
MAX_COMPLETION = 16_384  # DecodeLimits.max_completion_chars
MARKER = "/tmp/sapo-fuzz-MARKER"


def task_problems(task: str) -> list[Problem]:
    configs = [EASY_CONFIGS[task], *CONFIGS[task]]
    return [
        generate_problem(ProblemSpec(dataset=task, config=c, seed=3838, index=i)) for c in configs for i in range(4)
    ]


def near_misses(key: str) -> st.SearchStrategy[str]:
    """The key with a character changed, dropped, doubled or added, or a payload around it."""
    position = st.integers(0, max(0, len(key)))
    char = st.characters(codec="utf-8")
    return st.one_of(
        st.tuples(position, char).map(lambda t: key[: t[0]] + t[1] + key[t[0] + 1 :]),
        st.tuples(position, char).map(lambda t: key[: t[0]] + t[1] + key[t[0] :]),
        position.map(lambda i: key[:i] + key[i + 1 :]),
        st.tuples(st.text(max_size=40), st.text(max_size=40)).map(lambda t: t[0] + key + t[1]),
        st.sampled_from([key + ".", key + " hail thief", "\\frac{1}{2} " + key, key * 3, key.upper()]),
    )


def repeated(max_size: int) -> st.SearchStrategy[str]:
    """Long strings cheaply: a short piece repeated up to `max_size` characters."""
    return st.tuples(st.text(min_size=1, max_size=12), st.integers(1, max_size)).map(
        lambda t: (t[0] * (t[1] // len(t[0]) + 1))[: t[1]]
    )


HOSTILE = st.one_of(
    st.sampled_from(code_execution_answers(MARKER)),
    st.integers(1, 8000).map(lambda n: "(" * n + "P" + ")" * n),
    st.integers(1, 8000).map(lambda n: "[" * n + "1" + "]" * n),
    st.integers(1, 8000).map(lambda n: "¬" * n + "P"),
    st.integers(1, 3000).map(lambda n: " ∨ ".join(["(P ∧ Q)"] * n)),
    st.integers(-(10**400), 10**400).map(str),
    st.sampled_from(["1e999999999", "-1e-999999999", "NaN", "Infinity", "9" * 5000 + ".5", "0x10", "1_000"]),
    repeated(MAX_COMPLETION),
    st.text(max_size=200),
    st.builds(
        lambda n, d, tail: f"\\frac{{{n}}}{{{d}}}{tail}",
        st.integers(0, 10**30),
        st.integers(0, 10**30),
        st.text(max_size=60),
    ),
    st.builds(lambda n: "[[" + ", ".join(["1"] * n) + "]]", st.integers(1, 4000)),
)


def completions(problem: Problem) -> st.SearchStrategy[str]:
    answer = st.one_of(HOSTILE, near_misses(right_answer(problem)))
    return st.one_of(
        answer.map(lambda a: f"<answer>{a}</answer>"),
        answer.map(lambda a: f"{a}<answer>{a}</answer>"),
        answer.map(lambda a: "<answer>" * 500 + a),
        answer,
    ).map(lambda text: text[:MAX_COMPLETION])


SLOWEST: dict[str, tuple[float, str]] = defaultdict(lambda: (0.0, ""))


@pytest.mark.parametrize("task", PAPER_TASKS)
def test_hostile_answers_have_no_effect_but_a_score(task):
    problems = task_problems(task)
    seen = witness()
    refused = untrusted.refused_count

    @settings(
        max_examples=EXAMPLES_PER_TASK,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.sampled_from(problems).flatmap(lambda p: st.tuples(st.just(p), completions(p))))
    def check(case: tuple[Problem, str]) -> None:
        problem, completion = case
        with seen.watching():
            started = time.thread_time()
            score = score_completion(problem, completion)
            spent = time.thread_time() - started
            answer = bounded_answer(problem, completion)
            if answer is not None:
                with untrusted.untrusted_text():
                    assert SCORERS[task].score(problem, answer) == score  # raises nothing, scores the same
        assert 0.0 <= score <= 1.0
        if spent > SLOWEST[task][0]:
            SLOWEST[task] = (spent, completion[:60])

    check()
    print(f"\n{task}: slowest completion {SLOWEST[task][0] * 1000:.2f} ms CPU ({SLOWEST[task][1]!r})")
    assert seen.events == []
    assert untrusted.refused_count == refused
