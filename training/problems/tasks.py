"""ReasoningGYM problems that can be regenerated exactly from their spec.

A problem travels between peers as its spec (dataset, config, seed, index) plus the question
and answer key. Any node can rebuild it from the spec and so check a peer's answer key.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import io
import json
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# The nine tasks of the paper's controlled run (arXiv 2509.08721, section 4).
PAPER_TASKS: tuple[str, ...] = (
    "base_conversion",
    "basic_arithmetic",
    "arc_1d",
    "bf",
    "propositional_logic",
    "fraction_simplification",
    "decimal_arithmetic",
    "calendar_arithmetic",
    "binary_matrix",
)

# Settings at or below ReasoningGYM's easiest level in every attribute. Curriculum level 0 is
# not always easiest (base_conversion level 0 means values 1000-10000), so they are spelled out.
EASY_CONFIGS: dict[str, dict[str, Any]] = {
    "base_conversion": {"min_base": 2, "max_base": 10, "min_value": 0, "max_value": 64},
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+", "-"],
        "allow_parentheses": False,
        "allow_negation": False,
    },
    "arc_1d": {"min_size": 10, "max_size": 10},
    "bf": {"difficulty": 1},
    "propositional_logic": {
        "min_vars": 2,
        "max_vars": 2,
        "min_statements": 2,
        "max_statements": 2,
        "min_complexity": 1,
        "max_complexity": 1,
    },
    "fraction_simplification": {
        "min_value": 1,
        "max_value": 20,
        "min_factor": 2,
        "max_factor": 5,
        "styles": ["plain"],
    },
    "decimal_arithmetic": {
        "min_num_decimal_places": 1,
        "max_num_decimal_places": 1,
        "min_terms": 2,
        "max_terms": 2,
        "precision": 6,
    },
    "calendar_arithmetic": {"tasks": ["weekday_of_date"], "offset_upper_bound": 30},
    "binary_matrix": {"min_n": 2, "max_n": 3, "p_zero": 0.5},
}


def reasoning_gym_version() -> str:
    """The installed distribution version; the module's __version__ lags the wheel."""
    return importlib.metadata.version("reasoning-gym")


class ProblemSpec(BaseModel):
    """Everything needed to regenerate one problem exactly."""

    model_config = ConfigDict(frozen=True)

    dataset: str = Field(description="ReasoningGYM dataset name, e.g. basic_arithmetic")
    config: dict[str, Any] = Field(default_factory=dict, description="dataset config overrides")
    seed: int = Field(ge=0, lt=2**63, description="dataset seed")
    index: int = Field(ge=0, lt=2**31, description="item index within the seeded dataset")

    def key(self) -> str:
        """A stable identity for deduplication and caching."""
        return json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))


class Problem(BaseModel):
    model_config = ConfigDict(frozen=True)

    spec: ProblemSpec
    question: str
    answer: str
    metadata: dict[str, Any] = Field(default_factory=dict)


@functools.lru_cache(maxsize=256)
def _dataset(name: str, config_json: str, seed: int, size: int):
    import reasoning_gym

    config = json.loads(config_json)
    # Some generators (bf) print progress dots to stdout; keep the daemon's stdout clean.
    with contextlib.redirect_stdout(io.StringIO()):
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **config)


def _size_bucket(index: int) -> int:
    # Items depend only on (seed, index), not on the dataset size; rounding the size up keeps
    # the dataset cache small while still covering the index.
    size = 1024
    while size <= index:
        size *= 2
    return size


def dataset_for(spec: ProblemSpec):
    """The (cached) ReasoningGYM dataset that holds `spec`, for generation and scoring."""
    config_json = json.dumps(spec.config, sort_keys=True)
    return _dataset(spec.dataset, config_json, spec.seed, _size_bucket(spec.index))


def generate_problem(spec: ProblemSpec) -> Problem:
    """Regenerate the problem named by `spec`. Deterministic for a given reasoning-gym version."""
    return _generate_cached(spec.key())


# Every peer's group for the same question is verified by regenerating it; some generators
# (bf) take a good fraction of a second per item, so remember recent items.
@functools.lru_cache(maxsize=4096)
def _generate_cached(spec_key: str) -> Problem:
    spec = ProblemSpec(**json.loads(spec_key))
    dataset = dataset_for(spec)
    with contextlib.redirect_stdout(io.StringIO()):
        entry = dataset[spec.index]
    return Problem(
        spec=spec,
        question=str(entry["question"]),
        answer=str(entry["answer"]),
        metadata=_jsonable(entry.get("metadata", {})),
    )


def _jsonable(value: Any) -> Any:
    """Metadata must survive msgpack and JSON; anything exotic becomes its string form."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class TaskSpec(BaseModel):
    """One task in a node's mix."""

    name: str
    weight: float = Field(default=1.0, gt=0)
    config: dict[str, Any] = Field(default_factory=dict)


def default_task_specs(names: list[str] | tuple[str, ...] = PAPER_TASKS) -> list[TaskSpec]:
    unknown = [n for n in names if n not in EASY_CONFIGS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; choose from {', '.join(PAPER_TASKS)}")
    return [TaskSpec(name=n, config=dict(EASY_CONFIGS[n])) for n in names]


# ReasoningGYM draws item `index` of a dataset seeded `seed` from Random(seed + index) (97 of its
# datasets), so seeds 0, 1, 2 are one sequence shifted by one: nodes given neighbouring seeds (a
# study's, `make run`'s) asked one another's questions, and three in four of a node's questions
# had reached it from a peer first, answered (issue #42, bench/results/tiny-heterogeneous-standing).
# Each seed's questions start this far along that sequence: the wire's index is below 2^31, so
# no two streams ever meet, and seed < 2^32 keeps the start below the wire's 2^63.
STREAM_STRIDE = 2**31


def question_stream(seed: int) -> int:
    """The dataset seed of the questions a node with `seed` asks: a stream no other seed's meets."""
    return seed * STREAM_STRIDE


class TaskSampler:
    """Draws problems for one node: a weighted task choice, then the next unseen index.

    Each node owns a dataset seed (`question_stream` of its own: neighbouring seeds would ask
    one another's questions), so two nodes ask different questions; the index advances so a node
    does not repeat itself. Its state is two integers, saved with checkpoints.
    """

    def __init__(self, tasks: list[TaskSpec], dataset_seed: int, rng_seed: int):
        if not tasks:
            raise ValueError("a node needs at least one task")
        self.tasks = tasks
        self.dataset_seed = dataset_seed
        self.next_index = 0
        self._rng = random.Random(rng_seed)

    def sample(self, count: int) -> list[Problem]:
        weights = [t.weight for t in self.tasks]
        problems = []
        for _ in range(count):
            task = self._rng.choices(self.tasks, weights=weights, k=1)[0]
            spec = ProblemSpec(dataset=task.name, config=task.config, seed=self.dataset_seed, index=self.next_index)
            self.next_index += 1
            problems.append(generate_problem(spec))
        return problems

    def skip(self, count: int) -> None:
        """Move past `count` problems as `sample` would, without generating them."""
        weights = [t.weight for t in self.tasks]
        for _ in range(count):
            self._rng.choices(self.tasks, weights=weights, k=1)
            self.next_index += 1

    def state_dict(self) -> dict[str, Any]:
        return {"next_index": self.next_index, "rng": self._rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_index = int(state["next_index"])
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
