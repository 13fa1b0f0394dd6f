"""Each task's answer, parsed by a strict grammar of our own and scored without reasoning-gym's scorer.

reasoning-gym's `score_answer` functions were written to score a trusted model's output, and a
node scores strangers' answers. Read as an attacker would (docs/security.md, "Third-party code
on a stranger's bytes"), reasoning-gym 0.1.25's scorers for the nine tasks:
- binary_matrix calls `eval` on any answer that is not exactly the key: remote code execution;
- propositional_logic rescans the answer per operator and nesting level: quadratic, seconds of
  CPU for one 16 KB answer;
- fraction_simplification matches `\\frac{n}{d}` as a prefix: "\\frac{9}{10} hail thief" is right;
- the other four give partial credit to any answer that contains the key, payload and all.

So no reasoning-gym scorer ever sees a stranger's text. Each task here has:
- a length cap, checked before anything else: from the key where the task has one (an honest
  answer is never much longer), from the grammar where it has none (propositional_logic);
- a grammar that the *whole* answer must match (`re.fullmatch`, ASCII digits only, bounded
  repetition): nothing else may stand inside the tag;
- a scorer over the parsed value that gives full credit exactly where reasoning-gym's would
  (tests/training/test_task_scorers.py compares them on every key and on honest completions), and
  partial credit, under `--reward partial`, only to a well-formed answer. An answer that does not
  parse scores 0 (reasoning-gym gave 0.01-0.05 to some; containment credit is gone entirely).

Every function here is pure and bounded: text and a locally regenerated Problem in, a score out.
"""

from __future__ import annotations

import decimal
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from sapo.training.problems.logic import MAX_FORMULA_CHARS, Formula, is_tautology, parse_formula, premises_hold
from sapo.training.problems.tasks import Problem, dataset_for

FULL = 1.0
NOTHING = 0.0


@dataclass(frozen=True)
class TaskScorer:
    """How one task's answers are bounded, parsed and scored."""

    cap: Callable[[Problem], int]  # the longest answer worth parsing, in characters
    score: Callable[[Problem, str], float]  # an answer within the cap -> [0, 1]


def _cap_from_key(problem: Problem) -> int:
    # Room for another rendering of the same value (binary_matrix as a list of lists is about
    # twice its key), never a page of text.
    return 4 * len(problem.answer) + 64


def _cap_from_grammar(problem: Problem) -> int:
    return MAX_FORMULA_CHARS


# --- exact-match tasks: reasoning-gym's default scorer (1.0 for the key itself) ----------------

# Grammars for tasks whose key is the only right answer. Each accepts every key the allowed
# configs generate (checked over thousands of keys in the tests).
_EXACT_GRAMMARS: dict[str, re.Pattern[str]] = {
    "base_conversion": re.compile(r"[0-9a-zA-Z]{1,64}"),
    "basic_arithmetic": re.compile(r"[+-]?[0-9]{1,64}"),
    "arc_1d": re.compile(r"[0-9]{1,3}(?: [0-9]{1,3}){0,63}"),
    # a Brainf*ck program's output: printable ASCII, one line
    "bf": re.compile(r"[\x20-\x7e]{1,256}"),
}


def _exact(grammar: re.Pattern[str]) -> Callable[[Problem, str], float]:
    def score(problem: Problem, answer: str) -> float:
        if grammar.fullmatch(answer) is None:
            return NOTHING
        return FULL if answer == problem.answer else NOTHING

    return score


# --- binary_matrix ------------------------------------------------------------------------------

# A Python list of lists as Python prints it (a space after each comma at most): no room for text.
_MATRIX_ROW = r"\[[0-9]{1,4}(?:, ?[0-9]{1,4}){0,63},?\]"
_MATRIX_LIST = re.compile(r"\[" + _MATRIX_ROW + r"(?:, ?" + _MATRIX_ROW + r"){0,63},?\]")
_MATRIX_VALUE = re.compile(r"[0-9]{1,4}")


def _matrix_rows(answer: str) -> list[list[int]] | None:
    """A Python list of lists of integers, read by a grammar, never by `eval`."""
    if _MATRIX_LIST.fullmatch(answer) is None:
        return None
    return [[int(v) for v in _MATRIX_VALUE.findall(row)] for row in answer[1:-1].split("]")[:-1]]


def _score_binary_matrix(problem: Problem, answer: str) -> float:
    """reasoning-gym's: 1.0 for the key's own text; 0.1 for the same matrix written as a Python
    list of lists (which it read with `eval`)."""
    if answer == problem.answer:
        return FULL
    rows = _matrix_rows(answer)
    if rows is None:
        return NOTHING
    rendered = "\n".join(" ".join(str(value) for value in row) for row in rows)
    return 0.1 if rendered == problem.answer else NOTHING


# --- fraction_simplification ------------------------------------------------------------------

# Spaces are plain ASCII spaces, two at most: unicode whitespace is text too, and could carry a payload.
_NUMBER = r"[ ]{0,2}([0-9]{1,12})[ ]{0,2}"
_FRACTION = re.compile(
    r"\${0,2}[ ]{0,2}(?:\\(?i:d?frac)[ ]{0,2}\{" + _NUMBER + r"\}[ ]{0,2}\{" + _NUMBER + r"\}"
    r"|[+]?" + _NUMBER + "/" + _NUMBER + r")[ ]{0,2}\${0,2}"
)


def _score_fraction(problem: Problem, answer: str) -> float:
    """reasoning-gym's rule on a fraction that is the whole answer (`n/d`, `\\frac{n}{d}` or
    `\\dfrac{n}{d}`, optionally in `$`): 1.0 for the simplified fraction, 0.1 for the unsimplified
    numerator or denominator, 0.05 for another fraction."""
    match = _FRACTION.fullmatch(answer)
    if match is None:
        return NOTHING
    groups = [g for g in match.groups() if g is not None]
    numerator, denominator = int(groups[0]), int(groups[1])
    meta = problem.metadata
    if numerator == meta["simplified_numerator"] and denominator == meta["simplified_denominator"]:
        return FULL
    if numerator == meta["numerator"] or denominator == meta["denominator"]:
        return 0.1
    return 0.05


# --- decimal_arithmetic ---------------------------------------------------------------------------

# With an exponent, as the generator writes a key at low precision ("-6.8E+2").
_DECIMAL = re.compile(r"[+-]?(?:[0-9]{1,40}(?:\.[0-9]{0,40})?|\.[0-9]{1,40})(?:[eE][+-]?[0-9]{1,3})?")
# Exact arithmetic on two numbers of at most 81 digits: the generator sets the thread's decimal
# precision as low as 2, which would round a difference into the tolerance.
_EXACT_DECIMALS = decimal.Context(prec=200)


def _score_decimal(problem: Problem, answer: str) -> float:
    """reasoning-gym's: right when within one unit of the last decimal place the config asks for."""
    if _DECIMAL.fullmatch(answer) is None:
        return NOTHING
    places = dataset_for(problem.spec).config.max_num_decimal_places
    difference = _EXACT_DECIMALS.subtract(decimal.Decimal(answer), decimal.Decimal(problem.answer))
    return FULL if difference.copy_abs() <= _EXACT_DECIMALS.power(10, -places) else NOTHING


# --- calendar_arithmetic --------------------------------------------------------------------------

_WEEKDAYS = frozenset({"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"})
_WORD = re.compile(r"[A-Za-z]{1,16}")
_COUNT = re.compile(r"[+-]?[0-9]{1,12}")


def _score_calendar(problem: Problem, answer: str) -> float:
    """reasoning-gym's rule per calendar task: weekdays exact (0.1 for another weekday, 0.05 for
    one in another case), counts by relative error (exp(-5 e)), leap years by yes/no."""
    task = problem.metadata.get("task")
    if task in ("weekday_offset", "weekday_of_date", "weekday_of_date_from_first_date"):
        if _WORD.fullmatch(answer) is None:
            return NOTHING
        if answer == problem.answer:
            return FULL
        if answer in _WEEKDAYS:
            return 0.1
        return 0.05 if answer.title() in _WEEKDAYS else NOTHING
    if task in ("count_days", "count_business_days", "recurring_event_day"):
        if _COUNT.fullmatch(answer) is None:
            return NOTHING
        given, right = int(answer), int(problem.answer)
        if right == 0:
            return FULL if given == 0 else NOTHING
        return max(0.0, math.exp(-5 * abs(given - right) / right))
    if task == "is_leap_year":
        if _WORD.fullmatch(answer) is None:
            return NOTHING
        return FULL if answer.lower() == problem.answer.lower() else NOTHING
    return NOTHING


# --- propositional_logic ----------------------------------------------------------------------


def _score_logic(problem: Problem, answer: str) -> float:
    """reasoning-gym's rule: 1.0 for a conclusion the premises entail, 0.25 if it is trivial (a lone
    variable or a tautology), 0.05 for a well-formed formula they do not entail; and 0 for every
    answer when the premises contradict each other."""
    variables = list(problem.metadata["variables"])
    conclusion = parse_formula(answer, variables)
    if conclusion is None:
        return NOTHING
    premises = _premises(tuple(problem.metadata["premises"]), tuple(variables))
    if premises is None:
        return NOTHING  # not a problem this grammar can read: never credit what we cannot check
    holds = premises_hold(premises, variables)
    if holds == 0:
        # Contradictory premises entail everything, so reasoning-gym called any formula right: a
        # sender could pick such a spec to have any text of 512 characters scored 1.0. Nothing
        # is learnt from it.
        return NOTHING
    if holds & ~conclusion.table:  # an assignment where the premises hold and the conclusion does not
        return 0.05
    if conclusion.is_variable or is_tautology(conclusion, variables):
        return 0.25
    return FULL


@functools.lru_cache(maxsize=1024)
def _premises(texts: tuple[str, ...], variables: tuple[str, ...]) -> list[Formula] | None:
    """A problem's premises (regenerated here, never a peer's), parsed once for all its answers."""
    premises = [parse_formula(text, list(variables)) for text in texts]
    return None if any(p is None for p in premises) else [p for p in premises if p is not None]


SCORERS: dict[str, TaskScorer] = {
    **{task: TaskScorer(cap=_cap_from_key, score=_exact(grammar)) for task, grammar in _EXACT_GRAMMARS.items()},
    "binary_matrix": TaskScorer(cap=_cap_from_key, score=_score_binary_matrix),
    "fraction_simplification": TaskScorer(cap=_cap_from_key, score=_score_fraction),
    "decimal_arithmetic": TaskScorer(cap=_cap_from_key, score=_score_decimal),
    "calendar_arithmetic": TaskScorer(cap=_cap_from_key, score=_score_calendar),
    "propositional_logic": TaskScorer(cap=_cap_from_grammar, score=_score_logic),
}
