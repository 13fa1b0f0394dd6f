"""Settings for which ReasoningGYM tasks a node asks, how often, and how hard."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sapo.training.problems.tasks import EASY_CONFIGS, PAPER_TASKS, TaskSpec


class TaskSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(
        default_factory=lambda: list(PAPER_TASKS),
        description="ReasoningGYM tasks to sample (default: the paper's nine)",
    )
    task_weights: dict[str, float] = Field(
        default_factory=dict,
        description="relative sampling weight per task, e.g. basic_arithmetic=2,bf=0.5 (default 1)",
    )
    task_config: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per-task ReasoningGYM config overrides as JSON, e.g. "
        '{"basic_arithmetic": {"max_digits": 2}} (default: the easiest settings)',
    )

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, tasks: list[str]) -> list[str]:
        unknown = [t for t in tasks if t not in EASY_CONFIGS]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; choose from {', '.join(PAPER_TASKS)}")
        if not tasks:
            raise ValueError("at least one task is needed")
        return tasks

    @field_validator("task_weights")
    @classmethod
    def _positive_weights(cls, weights: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in weights.items() if not v > 0}
        if bad:
            raise ValueError(f"task weights must be > 0, got {bad}")
        return weights

    @model_validator(mode="after")
    def _overrides_name_tasks(self) -> TaskSettings:
        stray = sorted((set(self.task_weights) | set(self.task_config)) - set(self.tasks))
        if stray:
            raise ValueError(f"task_weights/task_config name tasks not in --tasks: {stray}")
        return self

    def specs(self) -> list[TaskSpec]:
        return [
            TaskSpec(
                name=name,
                weight=self.task_weights.get(name, 1.0),
                config={**EASY_CONFIGS[name], **self.task_config.get(name, {})},
            )
            for name in self.tasks
        ]
