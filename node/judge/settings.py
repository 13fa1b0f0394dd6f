"""The judge's settings, light enough to check before anything loads."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sapo.protocol.settings import check_multiaddr
from sapo.protocol.wire import judge_wire as wire
from sapo.training.problems.tasks import EASY_CONFIGS, PAPER_TASKS


class JudgeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: Path = Field(Path("sapo-judge"), description="identity key and judge.sqlite live here")
    listen: str = Field("/ip4/0.0.0.0/tcp/4101", description="multiaddr to listen on (port 0 = any free port)")
    tasks: list[str] = Field(default_factory=lambda: list(PAPER_TASKS), description="ReasoningGYM tasks to ask")
    request_timeout_seconds: float = Field(10.0, gt=0, description="bound on reading the EvalRequest and on each write")
    answer_timeout_seconds: float = Field(
        300.0, gt=0, description="bound on waiting for the Answer (the node may first finish a round's torch work)"
    )
    max_frame_bytes: int = Field(wire.MAX_FRAME_BYTES, ge=1024, le=1024 * 1024, description="largest frame accepted")
    max_concurrent: int = Field(64, ge=1, description="evaluations in flight at once; more are refused as busy")
    close_timeout_seconds: float = Field(5.0, gt=0, description="bound on closing a stream or the host")
    identity_seed: str | None = Field(
        None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="derive a new identity from this 32-byte hex seed (fixed ids for local demos only)",
    )

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, tasks: list[str]) -> list[str]:
        unknown = [t for t in tasks if t not in EASY_CONFIGS]
        if unknown or not tasks:
            raise ValueError(f"unknown or no task(s) {unknown}; choose from {', '.join(PAPER_TASKS)}")
        return tasks

    @field_validator("listen")
    @classmethod
    def _listen_is_a_multiaddr(cls, listen: str) -> str:
        check_multiaddr(listen, "listen address", "/ip4/0.0.0.0/tcp/4101")
        return listen
