"""A real Docker engine for the compose test (compose_swarm.py), on a machine that may use
loopback only: Debian's packages, a dockerd without a bridge, a base image made with
debootstrap (no registry is reachable), and the images built from the repo's own Dockerfiles.

Every step is a plain function of its inputs; what it starts, it returns, for the caller to stop.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "sapo-base:bookworm"
SAPO_IMAGE = "sapo:cpu"  # what docker/docker-compose.yml runs
PROMETHEUS_IMAGE = "sapo-test/prometheus:2.42"  # what tests/docker/compose.host-network.yml runs
TORCH = "torch==2.13.0"
# command -> the Debian package that has it
PACKAGES = {
    "dockerd": "docker.io",
    "docker-compose": "docker-compose",
    "debootstrap": "debootstrap",
    "chromium": "chromium",
}
# No bridge, so no 172.17/16 and no NAT rules; and leave the host's IP forwarding as it is.
DOCKERD_FLAGS = ["--bridge=none", "--iptables=false", "--ip-forward=false"]
DEBOOTSTRAP_INCLUDE = "python3,python3-venv,python3-pip,ca-certificates"


def sh(*args: str, check: bool = True, quiet: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """Run a command; on failure, raise with its output (and show it unless `quiet`)."""
    result = subprocess.run(list(args), text=True, capture_output=True, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    return result


def install_missing_packages() -> list[str]:
    """apt-get install what is missing of PACKAGES; returns what it installed."""
    missing = [package for command, package in PACKAGES.items() if shutil.which(command) is None]
    if missing:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        sh("apt-get", "update", "-qq", env=env)
        sh("apt-get", "install", "-y", "-qq", *missing, env=env)
    return missing


def engine_answers() -> bool:
    return sh("docker", "info", check=False).returncode == 0


@contextmanager
def docker_engine(log_path: Path, start_timeout: float = 60) -> Iterator[str]:
    """The running engine if there is one ("existing"), else a dockerd of our own ("started"),
    stopped again on the way out."""
    if engine_answers():
        yield "existing"
        return
    log = log_path.open("w")
    daemon = subprocess.Popen(["dockerd", *DOCKERD_FLAGS], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + start_timeout
        while not engine_answers():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start (exit {daemon.poll()}); see {log_path}")
            time.sleep(0.5)
        yield "started"
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()


def image_exists(name: str) -> bool:
    return sh("docker", "image", "inspect", name, check=False).returncode == 0


def ensure_base_image(name: str = BASE_IMAGE) -> bool:
    """Debian bookworm, minbase plus Python, imported as `name`; False if it was already there."""
    if image_exists(name):
        return False
    with tempfile.TemporaryDirectory(prefix="sapo-base-") as root:
        sh("debootstrap", "--variant=minbase", f"--include={DEBOOTSTRAP_INCLUDE}", "bookworm", root)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        sh("docker", "import", "-", name, stdin=tar.stdout)
        if tar.wait() != 0:
            raise RuntimeError(f"tar of the debootstrapped {root} failed")
    return True


def pip_config() -> dict[str, str]:
    """pip's settings as `pip config list` shows them: key (without its section) -> value."""
    listed = sh(sys.executable, "-m", "pip", "config", "list", check=False).stdout
    values = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        values[key.rsplit(".", 1)[-1]] = value.strip("'\"")
    return values


def stage_build_inputs(repo: Path = REPO) -> dict[str, str]:
    """Put this machine's torch wheel (found through pip's find-links) and the CA bundle pip's
    configuration names into docker/wheels/ and docker/certs/, the folders the Dockerfile
    takes them from. Both are git-ignored. Returns what was staged."""
    staged = {}
    wheels = repo / "docker" / "wheels"
    found = sh(
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-index",
        "--no-deps",
        "--only-binary=:all:",
        TORCH,
        "-d",
        str(wheels),
        check=False,
    )
    staged["torch wheel"] = next(
        (w.name for w in wheels.glob("torch-2.13.0*.whl")),
        f"none (the build downloads one): {found.stderr.strip()[-200:]}",
    )
    cert = pip_config().get("cert") or os.environ.get("PIP_CERT")
    if cert and Path(cert).is_file():
        shutil.copyfile(cert, repo / "docker" / "certs" / "pip-cert.crt")
        staged["CA bundle"] = cert
    else:
        staged["CA bundle"] = "none (pip's configuration names no cert)"
    return staged


def build(tag: str, dockerfile: Path, context: Path, build_args: dict[str, str]) -> None:
    """`docker build --network host` (there is no bridge) with the classic builder, which both
    Debian's docker.io CLI and newer CLIs without the buildx plugin have."""
    args = [arg for key, value in build_args.items() for arg in ("--build-arg", f"{key}={value}")]
    sh(
        "docker",
        "build",
        "--network",
        "host",
        "--force-rm",
        "-f",
        str(dockerfile),
        *args,
        "-t",
        tag,
        str(context),
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )


def build_images(repo: Path = REPO, base: str = BASE_IMAGE) -> None:
    """The sapo image from docker/Dockerfile as committed (build arguments only) and the test's Prometheus."""
    build(SAPO_IMAGE, repo / "docker" / "Dockerfile", repo, {"BASE_IMAGE": base})
    build(
        PROMETHEUS_IMAGE,
        repo / "tests" / "docker" / "prometheus.Dockerfile",
        repo / "tests" / "docker",
        {"BASE_IMAGE": base},
    )
