"""Which problems a peer may ask us to regenerate.

Verifying a message means running a ReasoningGYM generator on the sender's config, so the config
is attacker-chosen input to code that was never written for it. Some configs loop forever
(base_conversion with min_base == max_base), some are exponential (propositional_logic vars,
basic_arithmetic digits), some overflow dates. This table allows the paper's nine tasks with
generous but bounded ranges; anything else is refused before a generator runs.

Bounds are checked on the *effective* config (ReasoningGYM's defaults merged with the overrides),
because cross-field rules like min <= max must also hold for keys the sender left out.
`DEFAULTS` mirrors reasoning-gym 0.1.25's config dataclasses; a test checks it still does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sapo.protocol.wire.messages import Rejected, RejectReason


@dataclass(frozen=True)
class IntRange:
    lo: int
    hi: int

    def check(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an int, got {type(value).__name__}"
        if not self.lo <= value <= self.hi:
            return f"must be in [{self.lo}, {self.hi}], got {value}"
        return None


@dataclass(frozen=True)
class FloatRange:
    """An open-below interval (lo, hi]: p_zero = 0 would make every cell 1."""

    lo: float
    hi: float

    def check(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, got {type(value).__name__}"
        if not self.lo < value <= self.hi:  # also false for NaN
            return f"must be in ({self.lo}, {self.hi}], got {value!r}"
        return None


@dataclass(frozen=True)
class Flag:
    def check(self, value: Any) -> str | None:
        if not isinstance(value, bool):
            return f"must be a bool, got {type(value).__name__}"
        return None


@dataclass(frozen=True)
class OneOf:
    values: frozenset[str]

    def check(self, value: Any) -> str | None:
        if not isinstance(value, str) or value not in self.values:
            return f"must be one of {sorted(self.values)}"
        return None


@dataclass(frozen=True)
class SubsetOf:
    """A non-empty list of distinct allowed strings, so its length is bounded too."""

    values: frozenset[str]

    def check(self, value: Any) -> str | None:
        if not isinstance(value, list) or not value:
            return f"must be a non-empty list drawn from {sorted(self.values)}"
        if not all(isinstance(v, str) and v in self.values for v in value):
            return f"must be a non-empty list drawn from {sorted(self.values)}"
        if len(set(value)) != len(value):
            return "must not repeat values"
        return None


Rule = IntRange | FloatRange | Flag | OneOf | SubsetOf

_CALENDAR_TASKS = frozenset(
    {
        "weekday_offset",
        "weekday_of_date",
        "weekday_of_date_from_first_date",
        "recurring_event_day",
        "count_days",
        "count_business_days",
        "is_leap_year",
    }
)

# Allowed keys per dataset. The generator's `seed` and `size` are not config: they come from the
# spec, and passing them twice would crash create_dataset.
RULES: dict[str, dict[str, Rule]] = {
    "base_conversion": {
        "min_base": IntRange(2, 36),
        "max_base": IntRange(2, 36),
        "min_value": IntRange(0, 10**6),
        "max_value": IntRange(0, 10**6),
    },
    "basic_arithmetic": {
        "min_terms": IntRange(1, 8),
        "max_terms": IntRange(1, 8),
        "min_digits": IntRange(1, 6),
        "max_digits": IntRange(1, 6),
        "operators": SubsetOf(frozenset({"+", "-", "*", "/"})),
        "allow_parentheses": Flag(),
        "allow_negation": Flag(),
        "format_style": OneOf(frozenset({"simple", "natural"})),
        "whitespace": OneOf(frozenset({"no_space", "single", "random"})),
    },
    "arc_1d": {
        "min_size": IntRange(8, 40),
        "max_size": IntRange(8, 40),
        "num_train": IntRange(1, 5),
    },
    # difficulty 3 costs 0.2-2.5 s of CPU per item to generate: a cheap way to make us burn CPU
    "bf": {"difficulty": IntRange(1, 2)},
    "propositional_logic": {
        "min_vars": IntRange(1, 8),
        "max_vars": IntRange(1, 8),
        "min_statements": IntRange(1, 8),
        "max_statements": IntRange(1, 8),
        "min_complexity": IntRange(1, 5),
        "max_complexity": IntRange(1, 5),
    },
    "fraction_simplification": {
        "min_value": IntRange(1, 10**4),
        "max_value": IntRange(1, 10**4),
        "min_factor": IntRange(1, 1000),
        "max_factor": IntRange(1, 1000),
        "styles": SubsetOf(frozenset({"plain", "latex_inline", "latex_frac", "latex_dfrac"})),
    },
    "decimal_arithmetic": {
        "min_num_decimal_places": IntRange(0, 8),
        "max_num_decimal_places": IntRange(0, 8),
        "min_terms": IntRange(1, 8),
        "max_terms": IntRange(1, 8),
        # The generator sets the thread's global decimal precision to this; 28 is Python's default.
        "precision": IntRange(2, 28),
    },
    "calendar_arithmetic": {
        "year": IntRange(1000, 3000),
        "tasks": SubsetOf(_CALENDAR_TASKS),
        "offset_upper_bound": IntRange(1, 1000),
        "leap_year_range": IntRange(0, 1000),
    },
    "binary_matrix": {
        "min_n": IntRange(1, 12),
        "max_n": IntRange(1, 12),
        "p_zero": FloatRange(0.0, 1.0),
    },
}

# reasoning-gym 0.1.25's defaults for the keys above (tuples shown as lists, None as all tasks).
DEFAULTS: dict[str, dict[str, Any]] = {
    "base_conversion": {"min_base": 2, "max_base": 16, "min_value": 0, "max_value": 1000},
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 6,
        "min_digits": 1,
        "max_digits": 4,
        "operators": ["+", "-", "*", "/"],
        "allow_parentheses": True,
        "allow_negation": True,
        "format_style": "simple",
        "whitespace": "single",
    },
    "arc_1d": {"min_size": 10, "max_size": 30, "num_train": 3},
    "bf": {"difficulty": 1},
    "propositional_logic": {
        "min_vars": 2,
        "max_vars": 4,
        "min_statements": 2,
        "max_statements": 4,
        "min_complexity": 1,
        "max_complexity": 3,
    },
    "fraction_simplification": {
        "min_value": 1,
        "max_value": 1000,
        "min_factor": 1,
        "max_factor": 100,
        "styles": ["plain", "latex_inline", "latex_frac", "latex_dfrac"],
    },
    "decimal_arithmetic": {
        "min_num_decimal_places": 3,
        "max_num_decimal_places": 3,
        "min_terms": 2,
        "max_terms": 6,
        "precision": 12,
    },
    "calendar_arithmetic": {
        "year": 2022,
        "tasks": sorted(_CALENDAR_TASKS),
        "offset_upper_bound": 100,
        "leap_year_range": 200,
    },
    "binary_matrix": {"min_n": 3, "max_n": 10, "p_zero": 0.25},
}


def _ordered(lo: str, hi: str, strict: bool = False) -> Callable[[dict[str, Any]], str | None]:
    def check(cfg: dict[str, Any]) -> str | None:
        ok = cfg[lo] < cfg[hi] if strict else cfg[lo] <= cfg[hi]
        if not ok:
            return f"{lo}={cfg[lo]} must be {'<' if strict else '<='} {hi}={cfg[hi]}"
        return None

    return check


def _decimal_precision(cfg: dict[str, Any]) -> str | None:
    if cfg["precision"] <= cfg["max_num_decimal_places"] + 1:
        return "precision must exceed max_num_decimal_places + 1"
    return None


# Relations between keys, checked on the effective config.
CROSS_RULES: dict[str, list[Callable[[dict[str, Any]], str | None]]] = {
    # min_base == max_base makes the generator loop forever looking for a second base.
    "base_conversion": [
        _ordered("min_base", "max_base", strict=True),
        _ordered("min_value", "max_value", strict=True),
    ],
    "basic_arithmetic": [_ordered("min_terms", "max_terms"), _ordered("min_digits", "max_digits")],
    "arc_1d": [_ordered("min_size", "max_size")],
    "bf": [],
    "propositional_logic": [
        _ordered("min_vars", "max_vars"),
        _ordered("min_statements", "max_statements"),
        _ordered("min_complexity", "max_complexity"),
    ],
    "fraction_simplification": [
        _ordered("min_value", "max_value", strict=True),
        _ordered("min_factor", "max_factor"),
    ],
    "decimal_arithmetic": [
        _ordered("min_num_decimal_places", "max_num_decimal_places"),
        _ordered("min_terms", "max_terms"),
        _decimal_precision,
    ],
    "calendar_arithmetic": [],
    "binary_matrix": [_ordered("min_n", "max_n")],
}


def _reject(reason: RejectReason, detail: str) -> Rejected:
    return Rejected(reason, detail[:200])


def check_problem_spec(spec: Any) -> None:
    """Raise Rejected(unknown_dataset | config_out_of_range) unless `spec` is safe to generate.

    `spec` is a ProblemSpec or its wire twin: anything with dataset, config, seed and index.
    """
    dataset = spec.dataset
    if not isinstance(dataset, str) or dataset not in RULES:
        name = dataset[:64] if isinstance(dataset, str) else type(dataset).__name__
        raise _reject(RejectReason.unknown_dataset, f"dataset {name!r} is not allowed; allowed: {', '.join(RULES)}")
    for field, hi in (("seed", 2**63), ("index", 2**31)):
        value = getattr(spec, field)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < hi:
            raise _reject(RejectReason.config_out_of_range, f"{field} must be an int in [0, {hi})")
    config = spec.config
    if not isinstance(config, dict):
        raise _reject(RejectReason.config_out_of_range, "config must be a map")
    rules = RULES[dataset]
    for key, value in config.items():
        rule = rules.get(key)
        if rule is None:
            shown = key[:40] if isinstance(key, str) else type(key).__name__
            raise _reject(
                RejectReason.config_out_of_range,
                f"{dataset}: unknown config key {shown!r}; allowed: {', '.join(rules)}",
            )
        problem = rule.check(value)
        if problem:
            raise _reject(RejectReason.config_out_of_range, f"{dataset}.{key} {problem}")
    effective = {**DEFAULTS[dataset], **config}
    for cross in CROSS_RULES[dataset]:
        problem = cross(effective)
        if problem:
            raise _reject(RejectReason.config_out_of_range, f"{dataset}: {problem}")
