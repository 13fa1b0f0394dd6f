"""All of a node's settings, one pydantic model per concern, loaded with this precedence
(lowest first): defaults, a TOML file (--config), SAPO_* environment variables, CLI flags.

Every field name is unique across concerns, so the CLI flag (--max-new-tokens), the
environment variable (SAPO_MAX_NEW_TOKENS) and the TOML key (max_new_tokens, at top level or
inside a [model]/[training]/... table) all name the same thing.
"""

from __future__ import annotations

import json
import tomllib
import typing
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sapo.sampling.config import SamplingSettings
from sapo.training.config import ModelSettings, TrainingSettings
from sapo.training.task_settings import TaskSettings

ENV_PREFIX = "SAPO_"


class NetworkSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    listen: str = Field(default="/ip4/0.0.0.0/tcp/4001", description="multiaddr to listen on")
    peers: list[str] = Field(default_factory=list, description="bootstrap peers' multiaddrs (with /p2p/<peer id>)")
    swarm: str = Field(
        default="default", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="swarm name; the topic is sapo/<swarm>/rollouts/1"
    )
    max_message_bytes: int = Field(
        default=256 * 1024, ge=4096, le=900 * 1024, description="largest rollout message sent or accepted, bytes"
    )
    accept_other_rg_versions: bool = Field(
        default=False,
        description="accept groups from peers on another reasoning-gym release (their problems may not regenerate identically)",
    )
    compress: bool = Field(default=True, description="zlib-compress outgoing messages when it makes them smaller")
    identity_seed: str | None = Field(
        default=None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="derive a new identity from this 32-byte hex seed (fixed bootstrap ids for local demos only: "
        "anyone who knows the seed can act as this node)",
    )
    wait_for_peers: int = Field(
        default=0, ge=0, le=1000, description="before the first round, wait until this many peers are connected..."
    )
    wait_for_peers_seconds: float = Field(
        default=60.0, ge=0, description="...but no longer than this; then train alone and let peers join later"
    )
    swarm_key: Path | None = Field(
        default=None,
        description="libp2p swarm.key file (/key/swarm/psk/1.0.0/, /base16/, 64 hex chars): a private swarm "
        "whose every node has the same key; nodes without it cannot connect",
    )
    allow_peers: list[str] = Field(
        default_factory=list,
        description="if given, only these peer ids may connect and have their groups accepted or relayed",
    )
    discover_peers: int = Field(
        default=4,
        ge=0,
        le=64,
        description="ask connected peers for the signed records of peers they know and dial them until this many "
        "peers are connected (0 = only the --peers); lets a swarm grow past one bootstrap node's mesh",
    )
    peer_message_rate: float = Field(
        default=50.0, gt=0, description="messages per second one peer may publish (token bucket, by its signed sequence "
        "numbers); more are dropped and lower its score, and a flooder is banned; keep it above any honest node's rate"
    )
    peer_message_burst: int = Field(default=100, ge=1, description="messages one peer may publish in a burst")
    ban_seconds: float = Field(
        default=600.0, gt=0, description="a peer whose score falls too low (flooding, junk, bad signatures) is "
        "disconnected and refused for this long"
    )
    judge: str | None = Field(
        default=None,
        description="open judge's multiaddr (ending /p2p/<peer id>): it asks this node a held-out question every "
        "--judge-every rounds and records the greedy answer's score (see `sapo-node judge`); unset = not judged",
    )
    judge_every: int = Field(default=10, ge=1, description="ask the --judge for an evaluation every K rounds")

    @field_validator("judge")
    @classmethod
    def _judge_names_its_peer(cls, judge: str | None) -> str | None:
        if judge is None:
            return None
        from multiaddr import Multiaddr

        try:
            peer_id = Multiaddr(judge).get_peer_id()
        except Exception as error:
            peer_id, problem = None, str(error)
        else:
            problem = "no /p2p/<peer id> part"
        if not peer_id:
            raise ValueError(
                f"judge {judge!r} is not a multiaddr ending in /p2p/<peer id> ({problem}); "
                "copy the 'judge listening on ...' line the judge prints"
            )
        return judge


class RunSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: Path = Field(default=Path("sapo-data"), description="identity, checkpoints and metrics live here")
    rounds: int = Field(default=0, ge=0, description="rounds to run before stopping (0 = forever)")
    checkpoint_every: int = Field(default=10, ge=1, description="checkpoint every K rounds (and on clean shutdown)")
    keep_checkpoints: int = Field(default=3, ge=1, le=100, description="checkpoints kept on disk")
    seed: int = Field(default=0, ge=0, lt=2**32, description="seed for sampling, tasks and model init")
    generate_only: bool = Field(default=False, description="publish rollouts but never train (a non-training generator)")
    log_level: str = Field(default="INFO", description="logging level")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="serve Prometheus /metrics on this port (0 = any free port; unset = off)"
    )
    metrics_host: str = Field(default="127.0.0.1", description="address the /metrics server binds (0.0.0.0 in containers)")

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
    "tasks": TaskSettings,
    "network": NetworkSettings,
    "run": RunSettings,
}


class NodeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: ModelSettings = Field(default_factory=ModelSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    tasks: TaskSettings = Field(default_factory=TaskSettings)
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    run: RunSettings = Field(default_factory=RunSettings)

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
        raise SettingsError(f"config file {path} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
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
                raise SettingsError(f"unknown setting {name!r} in {source}; see `sapo-node start --help`")
            merged[owner[name]][name] = value
            source_of[name] = source
    try:
        return NodeSettings(**merged)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = [str(part) for part in error["loc"]]
            name = next((part for part in loc if part in owner), loc[-1] if loc else "?")
            flag = "--" + name.replace("_", "-")
            where = source_of.get(name, "defaults")
            problems.append(f"{flag} ({where}): {error['msg']}")
        raise SettingsError("invalid settings:\n  " + "\n  ".join(problems)) from None
