"""All of a node's settings, one pydantic model per concern, loaded with this precedence
(lowest first): defaults, a TOML file (--config), SAPO_* environment variables, CLI flags.

Every field name is unique across concerns, so the CLI flag (--max-new-tokens), the
environment variable (SAPO_MAX_NEW_TOKENS) and the TOML key (max_new_tokens, at top level or
inside a [model]/[training]/... table) all name the same thing.

Why the precedence is written here and not left to pydantic-settings: the concerns are plain
pydantic models that the library, the study and the tests build directly, and as `BaseSettings`
each would read SAPO_* variables from the environment wherever it is built (the library must
not read the environment). pydantic-settings maps environment variables onto nested models only
through a delimiter (SAPO_TRAINING__LR) where ours are flat (SAPO_LR), and its errors do not
say which source a bad value came from, where ours do. The whole precedence is `load_settings`,
about thirty lines; pydantic-settings is not a dependency.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sapo.protocol.settings import NetworkSettings, check_peer_address
from sapo.protocol.wire.allowlist import check_problem_spec
from sapo.protocol.wire.messages import Rejected
from sapo.sampling.config import SamplingSettings
from sapo.sampling.external_use import ExternalUse
from sapo.sampling.trust import TrustSettings
from sapo.training.config import ModelSettings, TrainingSettings
from sapo.training.problems.task_settings import TaskSettings
from sapo.training.problems.tasks import ProblemSpec

ENV_PREFIX = "SAPO_"


class RunSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: Path = Field(default=Path("sapo-data"), description="identity, checkpoints and metrics live here")
    rounds: int = Field(default=0, ge=0, description="rounds to run before stopping (0 = forever)")
    checkpoint_every: int = Field(
        default=10, ge=0, description="checkpoint every K rounds and on clean shutdown (0 = only on clean shutdown)"
    )
    keep_checkpoints: int = Field(default=3, ge=1, le=100, description="checkpoints kept on disk")
    seed: int | None = Field(
        default=None,
        ge=0,
        lt=2**32,
        description="seed for sampling, tasks and model init (unset = derived from the node's identity, so that no "
        "two nodes ask the same questions in the same order or sample alike)",
    )
    generate_only: bool = Field(
        default=False, description="publish rollouts but never train (a non-training generator)"
    )
    eval_every: int = Field(
        default=0,
        ge=0,
        description="every K rounds, answer a fixed held-out set greedily and record the accuracy "
        "per task (`heldout` in metrics.jsonl; 0 = never)",
    )
    eval_questions: int = Field(default=32, ge=1, le=4096, description="held-out questions per task (--eval-every)")
    eval_samples: int = Field(
        default=0,
        ge=0,
        le=64,
        description="also sample each held-out question K times at --temperature and record the full-credit "
        "fraction (sampled pass@1, `heldout_sampled` in metrics.jsonl; 0 = greedy only)",
    )
    draw_questions: int = Field(
        default=0,
        ge=0,
        le=256,
        description="draw this many questions from the task stream each round and ask the first I of them, so "
        "that runs with different I ask the same questions (a study's arms); 0 = draw exactly I",
    )
    log_level: str = Field(default="INFO", description="logging level")
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="serve Prometheus /metrics on this port (0 = any free port; unset = off)",
    )
    metrics_host: str = Field(
        default="127.0.0.1", description="address the /metrics server binds (0.0.0.0 in containers)"
    )
    judge: str | None = Field(
        default=None,
        description="open judge's multiaddr (ending /p2p/<peer id>): it asks this node a held-out question every "
        "--judge-every rounds and records the greedy answer's score (see `sapo-node judge`); unset = not judged",
    )
    judge_every: int = Field(default=10, ge=1, description="ask the --judge for an evaluation every K rounds")

    @field_validator("data_dir")
    @classmethod
    def _data_dir_is_a_directory(cls, path: Path) -> Path:
        if path.exists() and not path.is_dir():
            raise ValueError(
                f"data dir {str(path)!r} exists but is not a directory; give a directory (it is created if missing)"
            )
        return path

    @field_validator("judge")
    @classmethod
    def _judge_names_its_peer(cls, judge: str | None) -> str | None:
        if judge is not None:
            try:
                check_peer_address(judge, "judge")
            except ValueError as error:
                raise ValueError(f"{error}; copy the 'judge listening on ...' line the judge prints") from None
        return judge

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        value = value.upper()
        if value not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("log_level must be DEBUG, INFO, WARNING or ERROR")
        return value


CONCERNS: dict[str, type[BaseModel]] = {
    "model": ModelSettings,
    "training": TrainingSettings,
    "sampling": SamplingSettings,
    "external_use": ExternalUse,
    "trust": TrustSettings,
    "tasks": TaskSettings,
    "network": NetworkSettings,
    "run": RunSettings,
}


# `sapo-node start --help` and docs/settings.md show the settings in these groups: first the
# ones a user meets (the model, joining a swarm, the local/external mix, watching the node), then
# the rest of each concern under what it tunes.
EVERYDAY = (
    "model",
    "device",
    "lora",
    "tasks",
    "local",
    "external",
    "balance",
    "peers",
    "listen",
    "swarm",
    "swarm_key",
    "data_dir",
    "rounds",
    "seed",
    "generate_only",
    "torch_threads",
    "metrics_port",
    "metrics_host",
    "judge",
    "log_level",
)
TUNING_GROUPS = {
    "model": "model tuning",
    "training": "training tuning",
    "sampling": "inbox and balance tuning",
    "external_use": "the study's treatments: how external groups are used (defaults are what the studies support)",
    "trust": "trust in strangers: the screen of peers' completions and authors' standing (docs/security.md)",
    "tasks": "task tuning",
    "network": "network tuning",
    "run": "run tuning",
}


def settings_groups() -> list[tuple[str, list[str]]]:
    """(title, field names) for every setting, each in exactly one group, everyday first."""
    groups = [("everyday settings", list(EVERYDAY))]
    for concern, title in TUNING_GROUPS.items():
        groups.append((title, [name for name in CONCERNS[concern].model_fields if name not in EVERYDAY]))
    return groups


class NodeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: ModelSettings = Field(default_factory=ModelSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    external_use: ExternalUse = Field(default_factory=ExternalUse)
    trust: TrustSettings = Field(default_factory=TrustSettings)
    tasks: TaskSettings = Field(default_factory=TaskSettings)
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    run: RunSettings = Field(default_factory=RunSettings)

    @model_validator(mode="after")
    def _settings_agree(self) -> NodeSettings:
        if self.run.generate_only and self.sampling.local == 0:
            raise ValueError("--generate-only with --local 0 neither trains nor publishes: give --local at least 1")
        if self.run.generate_only and self.sampling.balance == "adaptive":
            raise ValueError(
                "--generate-only with --balance adaptive: a node that never trains has no reward gain "
                "to balance by; drop --balance or give --balance fixed"
            )
        most_local = self.sampling.local + (self.sampling.external if self.sampling.balance != "fixed" else 0)
        if self.run.draw_questions and most_local > self.run.draw_questions:
            raise ValueError(
                f"--draw-questions {self.run.draw_questions} is fewer than the {most_local} local questions a round "
                "may ask (I, or I + J with an adaptive balance); give at least that many, or 0"
            )
        for spec in self.tasks.specs():
            try:
                check_problem_spec(ProblemSpec(dataset=spec.name, config=spec.config, seed=0, index=0))
            except Rejected as rejected:
                # peers would refuse every group of ours, so nobody could learn from them
                raise ValueError(
                    f"--task-config: {rejected.detail}; peers accept only the ranges in protocol/wire/allowlist.py"
                ) from None
        return self

    def updated(self, values: Mapping[str, Any]) -> NodeSettings:
        """These settings with `values` (flat field names) laid over them, validated again."""
        owner = field_owner()
        unknown = sorted(set(values) - set(owner))
        if unknown:
            raise SettingsError(f"invalid settings:\n  unknown setting(s) {unknown}")
        merged = {concern: getattr(self, concern).model_dump() for concern in CONCERNS}
        for name, value in values.items():
            merged[owner[name]][name] = value
        try:
            return NodeSettings(**merged)
        except ValidationError as exc:
            raise SettingsError("invalid settings:\n  " + "\n  ".join(explain(exc, field_at=1))) from None

    def seeded_for(self, peer_id: str) -> NodeSettings:
        """These settings with --seed resolved: as given, or (unset) derived from the node's
        identity. Nodes left at one default seed would all walk one question stream in step and
        sample alike: a peer's group would be one the node asks itself, or asked already."""
        if self.run.seed is not None:
            return self
        seed = int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:4], "big")
        return self.model_copy(update={"run": self.run.model_copy(update={"seed": seed})})

    @property
    def seed(self) -> int:
        """--seed, once `seeded_for` has resolved it."""
        if self.run.seed is None:
            raise ValueError("--seed is unset until the node's identity resolves it (NodeSettings.seeded_for)")
        return self.run.seed

    def flat(self) -> dict[str, Any]:
        """Field name -> value, JSON-ready; recorded in checkpoints and experiment outputs."""
        out: dict[str, Any] = {}
        for concern in CONCERNS:
            out.update(getattr(self, concern).model_dump(mode="json"))
        return out


class SettingsError(ValueError):
    """A bad setting: the message names the setting, where it came from, and what is allowed."""


def field_owner() -> dict[str, str]:
    """Flat field name -> its concern. Names must be unique across concerns."""
    owner: dict[str, str] = {}
    for concern, model in CONCERNS.items():
        for name in model.model_fields:
            if name in owner:
                raise RuntimeError(f"setting {name!r} is defined by both {owner[name]} and {concern}")
            owner[name] = concern
    return owner


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list


def _is_dict(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict


def parse_text_value(name: str, annotation: Any, raw: str) -> Any:
    """Turn a CLI or environment string into what the field expects; pydantic validates after."""
    text = raw.strip()
    if _is_list(annotation):
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.replace(",", " ").split() if part.strip()]
    if _is_dict(annotation):
        if text.startswith("{"):
            return json.loads(text)
        pairs = [p for p in text.split(",") if p.strip()]
        result = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep:
                raise SettingsError(f"setting {name}: expected JSON or key=value pairs, got {raw!r}")
            result[key.strip()] = value.strip()
        return result
    return text


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SettingsError(f"invalid settings:\n  --config {str(path)!r}: the file does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"invalid settings:\n  --config {str(path)!r}: not valid TOML ({exc})") from None
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in CONCERNS and isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    return flat


def load_settings(
    cli: Mapping[str, Any] | None = None,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> NodeSettings:
    """Merge the four sources and validate. `cli` holds only flags the user actually gave."""
    owner = field_owner()
    layers: list[tuple[str, dict[str, Any]]] = []
    if config_file is not None:
        layers.append((f"config file {config_file}", _read_toml(config_file)))
    env_values: dict[str, Any] = {}
    for key, raw in (environ or {}).items():
        if key.startswith(ENV_PREFIX) and key[len(ENV_PREFIX) :].lower() in owner:
            name = key[len(ENV_PREFIX) :].lower()
            annotation = CONCERNS[owner[name]].model_fields[name].annotation
            env_values[name] = parse_text_value(key, annotation, raw)
    layers.append(("environment", env_values))
    layers.append(("command line", dict(cli or {})))

    merged: dict[str, dict[str, Any]] = {concern: {} for concern in CONCERNS}
    source_of: dict[str, str] = {}
    for source, values in layers:
        for name, value in values.items():
            if name not in owner:
                raise SettingsError(
                    f"invalid settings:\n  unknown setting {name!r} in {source}; see `sapo-node start --help`"
                )
            merged[owner[name]][name] = value
            source_of[name] = source
    try:
        return NodeSettings(**merged)
    except ValidationError as exc:
        raise SettingsError(
            "invalid settings:\n  " + "\n  ".join(explain(exc, field_at=1, source_of=source_of))
        ) from None


def explain(exc: ValidationError, field_at: int = 0, source_of: Mapping[str, str] | None = None) -> list[str]:
    """One line per problem: the flag, the bad value, where it came from, and what is allowed.
    `field_at`: where the field name sits in an error's location (1 under NodeSettings, whose
    first part is the concern). A check across settings names its flags in its own message."""
    lines = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        loc = error["loc"]
        if len(loc) <= field_at or not isinstance(loc[field_at], str):
            lines.append(message)
            continue
        name = str(loc[field_at])
        value = error.get("input")
        shown = (
            " " + " ".join(map(str, value))
            if isinstance(value, list)
            else ""
            if isinstance(value, dict)
            else f" {value!r}"
        )
        where = f" ({source_of.get(name, 'defaults')})" if source_of is not None else ""
        lines.append(f"--{name.replace('_', '-')}{shown}{where}: {message}")
    return lines
