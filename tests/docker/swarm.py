"""The compose swarm under test, as values: which services, on which ports, started how; and the
small waits and reads the checks in compose_swarm.py are made of."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.docker.engine import REPO, sh

PROJECT = "sapo-compose-test"
COMPOSE_FILE = REPO / "docker" / "docker-compose.yml"  # the file README tells users to run
OVERRIDE_FILE = REPO / "tests" / "docker" / "compose.host-network.yml"
# The monitoring profile's Prometheus, not its Grafana: no image of Grafana can be had here.
SERVICES = ["bootstrap", "peer", "peer-2", "peer-3", "judge", "prometheus"]
SAPO_SERVICES = ["bootstrap", "peer", "peer-2", "peer-3", "judge"]


def flag_value(command: list[str], name: str) -> str:
    return str(command[command.index(name) + 1])


@dataclass(frozen=True)
class Layout:
    """Where each service listens, read from the override (the one place that says it)."""

    pages: dict[str, int]  # node service -> its page port (/api/status, /metrics)
    ports: list[int]  # every 127.0.0.1 port the swarm binds
    prometheus: str  # host:port

    @classmethod
    def from_override(cls, path: Path = OVERRIDE_FILE) -> Layout:
        services = yaml.safe_load(path.read_text())["services"]
        pages = {
            name: int(flag_value(s["command"], "--metrics-port"))
            for name, s in services.items()
            if s["command"][0] == "start"
        }
        listens = [
            s["environment"]["SAPO_LISTEN"] for s in services.values() if "SAPO_LISTEN" in s.get("environment", {})
        ]
        listens.append(flag_value(services["judge"]["command"], "--listen"))
        web = next(c for c in services["prometheus"]["command"] if c.startswith("--web.listen-address="))
        prometheus = web.split("=", 1)[1]
        ports = [*pages.values(), *(int(a.split("/")[4]) for a in listens), int(prometheus.rsplit(":", 1)[1])]
        return cls(pages, ports, prometheus)


def merged_compose_file(out: Path) -> tuple[Path, dict[str, list]]:
    """docker/docker-compose.yml with the override, merged by compose itself (`config`), less the
    published ports of host-network services: docker-compose 1.29's Docker library refuses
    `ports` beside `network_mode: host` outright (the engine would only discard them), and an
    override cannot remove a list entry. The override binds those same ports on 127.0.0.1, so a
    user's addresses stay the same (tests/docker/test_compose.py checks it). -> (file, dropped)."""
    merged = yaml.safe_load(
        sh(
            "docker-compose",
            "-p",
            PROJECT,
            "-f",
            str(COMPOSE_FILE),
            "-f",
            str(OVERRIDE_FILE),
            "--profile",
            "monitoring",
            "config",
            cwd=REPO,
        ).stdout
    )
    dropped = {}
    for name, service in merged["services"].items():
        if service.get("network_mode") == "host" and "ports" in service:
            dropped[name] = service.pop("ports")
    path = out / "compose.merged.yml"
    path.write_text(yaml.safe_dump(merged, sort_keys=False))
    return path, dropped


@dataclass(frozen=True)
class Compose:
    """docker-compose on one project and file (the merged one)."""

    file: Path

    def __call__(self, *args: str, check: bool = True):
        return sh(
            "docker-compose",
            "-p",
            PROJECT,
            "-f",
            str(self.file),
            "--profile",
            "monitoring",
            *args,
            check=check,
            cwd=REPO,
        )

    def container_of(self, service: str) -> str:
        ids = self("ps", "-q", service).stdout.split()
        if len(ids) != 1:
            raise AssertionError(f"service {service} has {len(ids)} containers, not one: {ids}")
        return ids[0]


def inspect(container: str) -> dict[str, Any]:
    return json.loads(sh("docker", "inspect", container).stdout)[0]


def get_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.loads(answer.read())


def node_status(port: int) -> dict[str, Any]:
    return get_json(f"http://127.0.0.1:{port}/api/status")


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_until(what: str, check: Callable[[], tuple[bool, Any]], timeout: float, interval: float = 2.0) -> Any:
    """Poll `check` (-> (done, detail)) until done; the last detail says why not, on a timeout.
    A check that raises (a page not up yet) counts as not done."""
    deadline = time.monotonic() + timeout
    detail: Any = None
    while True:
        try:
            done, detail = check()
        except (OSError, ValueError, RuntimeError, AssertionError) as error:
            done, detail = False, repr(error)
        if done:
            return detail
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s; last seen: {detail}")
        time.sleep(interval)


@dataclass
class Clock:
    """Each phase's wall time, printed as it ends and in a table at the end."""

    started: float = field(default_factory=time.monotonic)
    phases: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        print(f"== {name}", flush=True)
        began = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = time.monotonic() - began
            print(f"   {name}: {self.phases[name]:.1f}s", flush=True)

    def table(self) -> str:
        rows = [f"  {name:<32} {seconds:>7.1f}s" for name, seconds in self.phases.items()]
        return "\n".join(["compose test phases:", *rows, f"  {'total':<32} {time.monotonic() - self.started:>7.1f}s"])
