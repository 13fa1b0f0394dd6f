"""Task configs at the far corners of what the allowlist lets a peer ask for, and the right
answer to a problem as its task's scorer reads it; for the scorer tests and their fuzzing."""

from __future__ import annotations

from sapo.training.problems.tasks import Problem

# The easiest settings, and the far corners of what the allowlist lets a peer ask for.
CONFIGS: dict[str, list[dict]] = {
    "base_conversion": [{"min_base": 2, "max_base": 36, "min_value": 0, "max_value": 10**6}],
    "basic_arithmetic": [
        {
            "min_terms": 2,
            "max_terms": 8,
            "min_digits": 1,
            "max_digits": 6,
            "operators": ["+", "-", "*", "/"],
            "allow_parentheses": True,
            "allow_negation": True,
        },
        {"format_style": "natural"},
    ],
    "arc_1d": [{"min_size": 8, "max_size": 40, "num_train": 5}],
    "bf": [{"difficulty": 2}],
    "propositional_logic": [
        {
            "min_vars": 1,
            "max_vars": 8,
            "min_statements": 1,
            "max_statements": 8,
            "min_complexity": 1,
            "max_complexity": 5,
        }
    ],
    "fraction_simplification": [{"min_value": 1, "max_value": 10**4, "min_factor": 1, "max_factor": 1000}],
    "decimal_arithmetic": [
        {"min_num_decimal_places": 0, "max_num_decimal_places": 8, "min_terms": 1, "max_terms": 8, "precision": 28},
        {"min_num_decimal_places": 0, "max_num_decimal_places": 0, "precision": 2},  # keys like -6.8E+2
    ],
    "calendar_arithmetic": [{}],  # every calendar task
    "binary_matrix": [{"min_n": 1, "max_n": 12, "p_zero": 0.9}],
}


def right_answer(problem: Problem) -> str:
    return problem.metadata["example_answer"] if problem.spec.dataset == "propositional_logic" else problem.answer
