"""Issue #38: the strict grammars and scorers (training/problems/task_scorers.py) against reasoning-gym's own.

Over the keys of every allowed config's extremes and many renderings of each (near misses, other
spacing and case, signs, fraction and matrix styles, random formulas, payloads after the value):
- every key reasoning-gym generates is right here, as there;
- nothing is right here that is not right there;
- what is right there and not here is always an answer outside the task's grammar: text after a
  right value (`\\frac{2}{7} hail`, `$\\frac{2}{7}$.`), or a malformed formula that reasoning-gym
  reads as a fresh variable (`(P → Q`, `¬P.`);
- under `--reward partial`, a well-formed answer earns what reasoning-gym gives it, except the
  containment credit of the exact-match tasks (an answer that merely contains the key), now 0.
"""

from __future__ import annotations

import random

import pytest

from bench import verifier_030  # the verifier before #38, one copy
from sapo.training.problems.logic import AND, IFF, IMPLIES, NOT, OR, parse_formula, premises_hold
from sapo.training.problems.rewards import extract_answer, is_correct, score_completion
from sapo.training.problems.task_scorers import SCORERS
from sapo.training.problems.tasks import EASY_CONFIGS, PAPER_TASKS, Problem, ProblemSpec, generate_problem
from tests.support.task_configs import CONFIGS, right_answer

PER_CONFIG = 40
# Exact-match tasks: reasoning-gym gave len(key)/len(answer) to any answer containing the key.
CONTAINMENT_CREDIT = {"base_conversion", "basic_arithmetic", "arc_1d", "bf"}


def problems() -> list[Problem]:
    found = []
    for task in PAPER_TASKS:
        for c, config in enumerate([EASY_CONFIGS[task], *CONFIGS[task]]):
            for index in range(PER_CONFIG):
                found.append(generate_problem(ProblemSpec(dataset=task, config=config, seed=3800 + c, index=index)))
    return found


# The old verifier, on text this test wrote (binary_matrix's scorer may `eval` it).
reasoning_gyms_score = verifier_030.answer_score


def renderings(problem: Problem, rng: random.Random) -> list[str]:
    key = right_answer(problem)
    found = [key, f"{key}.", f"{key} hail thief", f"hail thief {key}", key.upper(), key.lower(), key.title()]
    found += [key.replace(" ", "  "), f"+{key}", f"0{key}", f"{key}0", f"${key}$", f"{key}\n\nhail"]
    task, meta = problem.spec.dataset, problem.metadata
    if task == "fraction_simplification":
        n, d = meta["simplified_numerator"], meta["simplified_denominator"]
        found += [
            f"{n}/{d}",
            f"{n} / {d}",
            f"$\\frac{{{n}}}{{{d}}}$",
            f"\\dfrac{{{n}}}{{{d}}}",
            f"\\FRAC{{{n}}}{{{d}}}",
        ]
        found += [f"\\frac{{{n}}}{{{d}}} hail", f"{n}/{d} hail", f"+{n}/{d}", f"-{n}/{d}", f"$${n}/{d}$$"]
        found += [f"{meta['numerator']}/{meta['denominator']}", f"{n}/{d + 1}", f"{n + 1}/{d}", "1/0", "x/y"]
    if task == "decimal_arithmetic":
        found += [f"{key}00001", f"{key}1", key.rstrip("0"), str(float(key)), "1e3", "NaN", "Infinity", "1_0.5"]
    if task == "binary_matrix":
        rows = [[int(x) for x in row.split()] for row in key.split("\n")]
        found += [
            str(rows),
            str(rows).replace(" ", ""),
            key.replace("\n", " "),
            str(rows)[:-1] + ",]",
            str(tuple(rows)),
        ]
    if task == "calendar_arithmetic":
        found += ["Monday", "monday", "MONDAY", "Yes", "no", "12", "+12", "-3", "0"]
    if task == "propositional_logic":
        variables = meta["variables"]

        def formula(depth: int) -> str:
            if depth == 0 or rng.random() < 0.3:
                return rng.choice(variables)
            operator = rng.choice([AND, OR, IMPLIES, IFF, NOT])
            if operator == NOT:
                return NOT + formula(depth - 1)
            return f"({formula(depth - 1)} {operator} {formula(depth - 1)})"

        found += [formula(3) for _ in range(20)] + [formula(3)[1:-1] for _ in range(10)]
        found += [" ∧ ".join(meta["premises"]), *meta["premises"], "P → Q → P", "¬¬P", "P ∨ ¬P", "(P)", "P->Q", "PQ"]
    return found


@pytest.fixture(scope="module")
def compared() -> list[tuple[Problem, str, float, float]]:
    rng = random.Random(38)
    rows = []
    for problem in problems():
        for text in renderings(problem, rng):
            answer = extract_answer(f"<answer>{text}</answer>")
            assert answer is not None
            rows.append(
                (
                    problem,
                    answer,
                    reasoning_gyms_score(problem, answer),
                    score_completion(problem, f"<answer>{text}</answer>"),
                )
            )
    return rows


def contradictory(problem: Problem) -> bool:
    """Premises no assignment satisfies: reasoning-gym calls every formula right, we call none."""
    if problem.spec.dataset != "propositional_logic":
        return False
    variables = problem.metadata["variables"]
    premises = [parse_formula(p, variables) for p in problem.metadata["premises"]]
    return premises_hold([p for p in premises if p is not None], variables) == 0


def test_every_key_is_right_here_as_in_reasoning_gym():
    for problem in problems():
        ours = score_completion(problem, f"<answer>{right_answer(problem)}</answer>")
        if contradictory(problem):
            assert ours == 0.0
            continue
        assert ours == reasoning_gyms_score(problem, right_answer(problem)), problem.spec
        # propositional_logic's example may be trivial (0.25); base_conversion renders 0 as an
        # empty key, which no answer matches, there as here
        if problem.spec.dataset != "propositional_logic" and problem.answer:
            assert ours == 1.0, problem.spec


def test_nothing_is_right_here_that_reasoning_gym_marks_wrong(compared):
    lenient = [(p.spec.dataset, a) for p, a, old, new in compared if is_correct(new) and not is_correct(old)]
    assert lenient == []


def test_what_only_reasoning_gym_marks_right_is_outside_the_grammar(compared):
    stricter = [(p, a) for p, a, old, new in compared if is_correct(old) and not is_correct(new)]
    for problem, answer in stricter:
        assert contradictory(problem) or SCORERS[problem.spec.dataset].score(problem, answer) == 0.0, (
            problem.spec.dataset,
            answer,
        )
    tasks = {problem.spec.dataset for problem, _ in stricter}
    # decimal_arithmetic: Python's digit separators ("1_0.5"), which Decimal reads and the grammar does not
    assert tasks <= {"fraction_simplification", "propositional_logic", "decimal_arithmetic"}
    assert any(answer.endswith(" hail thief") for _, answer in stricter)  # the payload after a right \frac


def test_partial_credit_for_a_well_formed_answer_is_reasoning_gyms(compared):
    for problem, answer, old, new in compared:
        task = problem.spec.dataset
        if contradictory(problem):
            assert new == 0.0
            continue
        if new > 0 and task not in CONTAINMENT_CREDIT:
            assert new == pytest.approx(old), (task, answer)
        if task in CONTAINMENT_CREDIT:
            assert new in (0.0, 1.0) and (new == 1.0) == (old == 1.0), (task, answer)


def test_a_payload_after_a_right_fraction_scores_nothing():
    problem = generate_problem(
        ProblemSpec(dataset="fraction_simplification", config=EASY_CONFIGS["fraction_simplification"], seed=38, index=0)
    )
    n, d = problem.metadata["simplified_numerator"], problem.metadata["simplified_denominator"]
    assert score_completion(problem, f"<answer>\\frac{{{n}}}{{{d}}}</answer>") == 1.0
    assert score_completion(problem, f"<answer>\\frac{{{n}}}{{{d}}} hail thief</answer>") == 0.0
    assert reasoning_gyms_score(problem, f"\\frac{{{n}}}{{{d}}} hail thief") == 1.0  # what 0.3.0 rewarded


@pytest.mark.parametrize("task", ["basic_arithmetic", "bf", "base_conversion", "arc_1d"])
def test_partial_reward_gives_no_credit_for_a_phrase_after_the_key(task):
    problem = generate_problem(ProblemSpec(dataset=task, config=EASY_CONFIGS[task], seed=38, index=1))
    assert reasoning_gyms_score(problem, f"{problem.answer} hail thief") > 0.05  # 0.3.0's partial credit
    assert score_completion(problem, f"<answer>{problem.answer} hail thief</answer>") == 0.0


def test_an_answer_over_its_cap_is_not_parsed():
    problem = generate_problem(ProblemSpec(dataset="arc_1d", config=EASY_CONFIGS["arc_1d"], seed=38, index=2))
    cap = SCORERS["arc_1d"].cap(problem)
    padded = problem.answer + " " * (cap - len(problem.answer))
    assert score_completion(problem, f"<answer>{problem.answer}</answer>") == 1.0
    assert score_completion(problem, f"<answer>x{padded}x</answer>") == 0.0


def test_the_last_answer_block_is_read_as_before():
    assert extract_answer("<answer>1</answer> then <answer> 2 </answer>") == "2"
    assert extract_answer("<answer>a <answer>b</answer>") == "a <answer>b"  # non-greedy, left to right
    assert extract_answer("<answer>1</answer><answer>unclosed") == "1"
    assert extract_answer("no tag") is None and extract_answer("<answer>" * 2000) is None


def test_contradictory_premises_make_no_answer_right():
    """Premises `(Q ↔ Q)`, `Q`, `¬Q` entail everything: reasoning-gym scored any formula 1.0."""
    problem = generate_problem(
        ProblemSpec(dataset="propositional_logic", config={}, seed=4388141300810805698, index=644)
    )
    assert contradictory(problem)
    for answer in ["P ∧ ¬P", "¬(Q ∨ ¬Q)", "(P → Q) ∧ ¬(P → Q)", "Q"]:
        assert reasoning_gyms_score(problem, answer) >= 0.25
        assert score_completion(problem, f"<answer>{answer}</answer>") == 0.0


def test_whitespace_around_or_inside_an_answer_carries_no_payload():
    """The screen skips the tag's content, so whitespace there could encode a phrase unseen."""
    problem = generate_problem(
        ProblemSpec(dataset="basic_arithmetic", config=EASY_CONFIGS["basic_arithmetic"], seed=38, index=3)
    )
    bits = "".join(" \t"[int(b)] for b in "".join(f"{ord(c):08b}" for c in "hail to the thief, " * 50))
    assert reasoning_gyms_score(problem, f"{bits}{problem.answer}\n{bits}".strip()) == 1.0
    assert score_completion(problem, f"<answer>{bits}{problem.answer}\n{bits}</answer>") == 0.0
    assert score_completion(problem, f"<answer>\n  {problem.answer} \n</answer>") == 1.0  # as models write it
    assert score_completion(problem, f"<answer>\u2000{problem.answer}</answer>") == 0.0
    fraction = generate_problem(
        ProblemSpec(dataset="fraction_simplification", config={"styles": ["latex_frac"]}, seed=38, index=0)
    )
    n, d = fraction.metadata["simplified_numerator"], fraction.metadata["simplified_denominator"]
    assert score_completion(fraction, f"<answer>$\\frac{{{n}}}{{{d}}}$</answer>") == 1.0
    assert score_completion(fraction, f"<answer>$\\frac\x1c\u2028{{{n}\u2000}}{{{d}}}$</answer>") == 0.0


def test_a_decimal_key_in_exponent_notation_is_right():
    config = {"precision": 2, "min_num_decimal_places": 0, "max_num_decimal_places": 0}
    problem = generate_problem(ProblemSpec(dataset="decimal_arithmetic", config=config, seed=0, index=17))
    assert "E" in problem.answer
    assert score_completion(problem, f"<answer>{problem.answer}</answer>") == 1.0
    assert score_completion(problem, f"<answer>{int(float(problem.answer))}</answer>") == 1.0
