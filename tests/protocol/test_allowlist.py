"""The allowlist: what a peer may make us generate."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest

from sapo.protocol.wire.allowlist import DEFAULTS, RULES, FloatRange, IntRange, SubsetOf, check_problem_spec
from sapo.protocol.wire.messages import Rejected, RejectReason, WireProblemSpec
from sapo.training.problems.tasks import EASY_CONFIGS, PAPER_TASKS, ProblemSpec, generate_problem


def spec(dataset: str, config: dict | None = None, seed: int = 1, index: int = 0) -> ProblemSpec:
    return ProblemSpec(dataset=dataset, config=config or {}, seed=seed, index=index)


def reason(s) -> RejectReason:
    with pytest.raises(Rejected) as info:
        check_problem_spec(s)
    return info.value.reason


def test_table_covers_exactly_the_paper_tasks():
    assert set(RULES) == set(PAPER_TASKS) == set(DEFAULTS)


@pytest.mark.parametrize("dataset", PAPER_TASKS)
def test_easy_configs_and_defaults_pass(dataset):
    check_problem_spec(spec(dataset, EASY_CONFIGS[dataset]))
    check_problem_spec(spec(dataset, {}))
    check_problem_spec(WireProblemSpec(dataset=dataset, config=EASY_CONFIGS[dataset], seed=0, index=0))


@pytest.mark.parametrize("dataset", PAPER_TASKS)
def test_defaults_mirror_the_installed_reasoning_gym(dataset):
    # Cross-field rules run on DEFAULTS merged with overrides, so they must match the generator's.
    from reasoning_gym.factory import DATASETS

    _, config_cls = DATASETS[dataset]
    real = config_cls()
    for key, value in DEFAULTS[dataset].items():
        actual = getattr(real, key)
        actual = sorted(actual) if key == "tasks" else list(actual) if isinstance(actual, tuple) else actual
        assert actual == value, f"{dataset}.{key}: reasoning-gym has {actual!r}, DEFAULTS {value!r}"
    fields = {f.name for f in dataclasses.fields(config_cls)} - {"seed", "size"}
    assert set(RULES[dataset]) == fields, "a new config key needs a rule (or a reason to refuse it)"


@pytest.mark.parametrize("name", ["leg_counting", "", "BASIC_ARITHMETIC", "basic_arithmetic "])
def test_unknown_dataset(name):
    assert reason(spec(name)) == RejectReason.unknown_dataset


@pytest.mark.parametrize(
    "dataset, config",
    [
        ("basic_arithmetic", {"max_terms": 9}),
        ("basic_arithmetic", {"max_digits": 7}),
        ("basic_arithmetic", {"min_terms": 0}),
        ("basic_arithmetic", {"operators": ["+", "**"]}),
        ("basic_arithmetic", {"operators": []}),
        ("basic_arithmetic", {"operators": "+-"}),
        ("basic_arithmetic", {"operators": ["+", "+"]}),
        ("basic_arithmetic", {"allow_negation": 1}),
        ("basic_arithmetic", {"format_style": "fancy"}),
        ("basic_arithmetic", {"max_terms": 3.0}),
        ("basic_arithmetic", {"max_terms": True}),
        ("basic_arithmetic", {"max_terms": "3"}),
        ("basic_arithmetic", {"min_terms": 5, "max_terms": 3}),
        ("basic_arithmetic", {"min_digits": 5}),  # above the default max_digits 4
        ("basic_arithmetic", {"seed": 3}),  # seed and size come from the spec, never the config
        ("basic_arithmetic", {"size": 10**9}),
        ("basic_arithmetic", {"unknown": 1}),
        ("base_conversion", {"max_value": 10**6 + 1}),
        ("base_conversion", {"min_base": 16}),  # == default max_base: the generator loops forever
        ("base_conversion", {"min_base": 10, "max_base": 10}),
        ("base_conversion", {"max_base": 37}),
        ("base_conversion", {"min_value": 5, "max_value": 5}),
        ("arc_1d", {"max_size": 41}),
        ("arc_1d", {"min_size": 7}),
        ("arc_1d", {"num_train": 0}),
        ("bf", {"difficulty": 0}),
        ("bf", {"difficulty": 4}),
        ("propositional_logic", {"max_vars": 9}),
        ("propositional_logic", {"max_complexity": 6}),
        ("fraction_simplification", {"styles": ["plain", "bold"]}),
        ("fraction_simplification", {"max_factor": 1001}),
        ("fraction_simplification", {"min_value": 1000}),  # == default max_value
        ("decimal_arithmetic", {"precision": 29}),
        ("decimal_arithmetic", {"precision": 4}),  # must exceed max places (3) + 1
        ("decimal_arithmetic", {"max_num_decimal_places": 9}),
        ("calendar_arithmetic", {"year": 9999}),
        ("calendar_arithmetic", {"tasks": ["Weekday_Offset"]}),
        ("calendar_arithmetic", {"offset_upper_bound": 0}),
        ("calendar_arithmetic", {"tasks": None}),
        ("binary_matrix", {"max_n": 13}),
        ("binary_matrix", {"p_zero": 0.0}),
        ("binary_matrix", {"p_zero": 1.5}),
        ("binary_matrix", {"p_zero": math.nan}),
        ("binary_matrix", {"p_zero": True}),
    ],
)
def test_config_out_of_range(dataset, config):
    assert reason(spec(dataset, config)) == RejectReason.config_out_of_range


def test_seed_and_index_are_bounded_even_without_pydantic():
    class Loose:  # a spec that skipped validation, e.g. built with model_construct
        dataset, config = "bf", {}
        seed, index = 0, 0

    check_problem_spec(Loose)
    for field, value in [("seed", -1), ("seed", 2**63), ("index", 2**31), ("index", True), ("index", 1.0)]:
        bad = type("Bad", (Loose,), {field: value})
        assert reason(bad) == RejectReason.config_out_of_range, (field, value)


def test_p_zero_accepts_ints_and_floats():
    check_problem_spec(spec("binary_matrix", {"p_zero": 1}))
    check_problem_spec(spec("binary_matrix", {"p_zero": 0.01}))


def _upper_bound_config(dataset: str) -> dict:
    """The largest problem the allowlist admits: every max at its ceiling, every list full."""
    config = {}
    for key, rule in RULES[dataset].items():
        if isinstance(rule, IntRange):
            config[key] = rule.lo if key.startswith("min_") else rule.hi
        elif isinstance(rule, FloatRange):
            config[key] = rule.hi
        elif isinstance(rule, SubsetOf):
            config[key] = sorted(rule.values)
    return config


# bf at difficulty 3 is the slowest allowed generator: compiling and interpreting its program
# takes 0.2-2.5 s an item, so that case runs only with -m slow.
_LARGEST = [pytest.param(d, marks=pytest.mark.slow) if d == "bf" else d for d in PAPER_TASKS]


@pytest.mark.parametrize("dataset", _LARGEST)
def test_the_largest_allowed_problems_generate_quickly(dataset):
    config = _upper_bound_config(dataset)
    check_problem_spec(spec(dataset, config))
    generate_problem(spec(dataset, config, seed=99, index=0))  # builds and caches the dataset
    start = time.perf_counter()
    for index in range(1, 4):
        problem = generate_problem(spec(dataset, config, seed=99, index=index))
        assert len(problem.question) < 8_192 and len(problem.answer) < 4_096
    assert (time.perf_counter() - start) / 3 < 3.0
