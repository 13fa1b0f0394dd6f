"""`make compose-test`: the compose swarm users run, on a real Docker engine, checked end to end.

    .venv/bin/python -m tests.docker.compose_swarm [--out compose-test-out]

Root (apt-get, dockerd). It installs what is missing (docker.io, docker-compose, debootstrap,
chromium), starts dockerd without a bridge if none runs, builds a bookworm base image with
debootstrap (once; cached after), builds the sapo image from docker/Dockerfile as committed
(build arguments only), and brings up docker/docker-compose.yml with the host-network override
tests/docker/compose.host-network.yml: bootstrap, 3 peers, the judge and the monitoring
profile's Prometheus. Then it checks what a user would look at:

- every node's /api/status: connected peers, and groups accepted from each of the other nodes;
- the judge committed scores for every node; every container turns healthy, runs as a non-root
  user, on the host's network, with the node as PID 1;
- Prometheus has every node's target up and their sapo_ series;
- the bootstrap node's page, served from its container, in headless Chromium (a screenshot);
- a node killed with SIGKILL is restarted by compose, keeps its peer id (its volume's
  identity), resumes from its volume's last checkpoint and trains the round after it;
- `docker-compose stop` stops every container cleanly (exit 0) within its stop timeout, and
  `down -v` leaves no container, network or volume behind, and no new network interface.

Traffic stays on 127.0.0.1: host networking, no bridge. It prints each phase's time and the total.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import psutil

from tests.docker import engine
from tests.docker.swarm import (
    SAPO_SERVICES,
    SERVICES,
    Clock,
    Compose,
    Layout,
    get_json,
    inspect,
    merged_compose_file,
    node_status,
    port_in_use,
    sh,
    wait_until,
)

SWARM_TIMEOUT = 420  # seconds for 4 tiny nodes on 2 shared cores to load, mesh and trade groups
UID = 10001  # the image's `sapo` user (docker/Dockerfile)
VICTIM = "peer-2"  # the node the restart check kills
# Run by the judge container's own Python, on the database in its volume: per peer, how many
# scores are committed, their mean and the last round judged.
JUDGE_SCORES = (
    "import json, sqlite3; db = sqlite3.connect('file:/data/judge.sqlite?mode=ro', uri=True); "
    "print(json.dumps({p: [n, s, r] for p, n, s, r in db.execute("
    "'SELECT peer_id, COUNT(*), AVG(score), MAX(node_round) FROM results GROUP BY peer_id')}))"
)
SIGTERM_LINE = re.compile(r"^(\S+) .*received SIGTERM", re.M)


def snapshot() -> dict[str, set[str]]:
    """What exists on this machine that the test must leave as it found it."""
    return {
        "containers": set(sh("docker", "ps", "-aq").stdout.split()),
        "networks": set(sh("docker", "network", "ls", "-q").stdout.split()),
        "volumes": set(sh("docker", "volume", "ls", "-q").stdout.split()),
        "interfaces": {f"{name} {a.address}" for name, addresses in psutil.net_if_addrs().items() for a in addresses},
    }


def bring_up(compose: Compose, layout: Layout, dropped: dict[str, list]) -> None:
    busy = [port for port in layout.ports if port_in_use(port)]
    if busy:
        raise AssertionError(
            f"127.0.0.1 port(s) {busy} are in use; the swarm needs {layout.ports} (stop what holds them)"
        )
    print(f"   {compose.file}: published ports left out under host networking (bound on 127.0.0.1 instead): {dropped}")
    compose("up", "-d", "--no-build", *SERVICES)


def check_containers(compose: Compose) -> None:
    """Host network only, a bounded log, the non-root user, the node as PID 1 (docker stop's SIGTERM reaches it)."""
    for service in SAPO_SERVICES:
        container = compose.container_of(service)
        facts = inspect(container)
        assert facts["HostConfig"]["NetworkMode"] == "host", f"{service}: network {facts['HostConfig']['NetworkMode']}"
        log = facts["HostConfig"]["LogConfig"]
        assert log["Type"] == "json-file" and log["Config"].get("max-size") == "10m", f"{service}: unbounded log {log}"
        uid = sh("docker", "exec", container, "id", "-u").stdout.strip()
        assert uid == str(UID), f"{service} runs as uid {uid}, not the image's sapo user ({UID})"
        pid1 = sh("docker", "exec", container, "cat", "/proc/1/cmdline").stdout.replace("\0", " ")
        assert "sapo-node" in pid1, f"{service}: PID 1 is {pid1!r}, not the node (docker/entrypoint.sh must exec it)"
    assert inspect(compose.container_of("prometheus"))["HostConfig"]["NetworkMode"] == "host"


def wait_for_swarm(layout: Layout) -> dict[str, dict]:
    """Every node connected and trading: groups accepted from each of the others. -> status by service."""

    def trading() -> tuple[bool, dict]:
        statuses = {service: node_status(port) for service, port in layout.pages.items()}
        ids = {service: s["peer_id"] for service, s in statuses.items()}
        missing = {}
        for service, status in statuses.items():
            accepted = {row["peer_id"] for row in status["peers"] if row["accepted"] > 0}
            connected = [row for row in status["peers"] if row["connected"]]
            lacking = [other for other, peer_id in ids.items() if other != service and peer_id not in accepted]
            if not connected or lacking:
                missing[service] = (
                    f"round {status['round']}, {len(connected)} connected, nothing accepted yet from {lacking}, refused: {status['rejected']}"
                )
        return not missing, (statuses if not missing else missing)

    statuses = wait_until("every node accepts groups from every other node", trading, SWARM_TIMEOUT)
    for service, status in statuses.items():
        authors = {row["peer_id"][-8:]: row["accepted"] for row in status["peers"] if row["accepted"]}
        print(
            f"   {service:<10} {status['peer_id']} round {status['round']:>3}, {status['accepted']} groups accepted "
            f"(by author {authors}), {sum(r['connected'] for r in status['peers'])} peers connected"
        )
    return statuses


def wait_for_judge(compose: Compose, peer_ids: list[str]) -> dict[str, list]:
    """The judge's database (in its volume) holds committed scores for every node."""

    def scored() -> tuple[bool, dict]:
        scores = json.loads(sh("docker", "exec", compose.container_of("judge"), "python3", "-c", JUDGE_SCORES).stdout)
        return all(p in scores for p in peer_ids), scores

    scores = wait_until("the judge has scores for every node", scored, SWARM_TIMEOUT)
    for peer_id, (count, mean, last_round) in scores.items():
        print(f"   judge: {peer_id} {count} scores committed, mean {mean:.3f}, last at round {last_round}")
    return scores


def wait_healthy(compose: Compose) -> None:
    def healthy() -> tuple[bool, dict]:
        states = {s: inspect(compose.container_of(s))["State"].get("Health", {}).get("Status") for s in SAPO_SERVICES}
        return all(state == "healthy" for state in states.values()), states

    print(f"   {wait_until('every sapo container is healthy', healthy, 180)}")


def check_prometheus(layout: Layout, out: Path) -> None:
    """Every node's target up, and sapo_ series from each of them."""
    base = f"http://{layout.prometheus}/api/v1"
    expected = {f"127.0.0.1:{port}" for port in layout.pages.values()}

    def scraped() -> tuple[bool, dict]:
        targets = get_json(f"{base}/targets")["data"]["activeTargets"]
        health = {t["labels"]["instance"]: t["health"] for t in targets}
        series = get_json(f"{base}/query?query=count+by+(instance)+(%7B__name__%3D~%22sapo_.%2B%22%7D)")["data"][
            "result"
        ]
        per_instance = {r["metric"]["instance"]: int(r["value"][1]) for r in series}
        done = set(health) == expected and all(h == "up" for h in health.values()) and set(per_instance) == expected
        return done, {"targets": health, "sapo_series": per_instance}

    seen = wait_until("Prometheus scrapes every node", scraped, 120)
    names = [n for n in get_json(f"{base}/label/__name__/values")["data"] if n.startswith("sapo_")]
    (out / "prometheus.json").write_text(json.dumps({**seen, "sapo_names": names}, indent=1))
    print(f"   targets {seen['targets']}\n   sapo_ series per node {seen['sapo_series']}; {len(names)} sapo_ names")


def screenshot_page(url: str, shot: Path, profile: Path) -> None:
    """The bootstrap node's page, as tests/node/daemon/test_page.py takes it."""
    chromium = next(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n))
    base = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
    ]
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    rows = re.findall(r'data-peer="(\w+)"', dom.stdout)
    assert len(set(rows)) >= 3 and re.search(r'id="phase"[^>]*>training<', dom.stdout), (
        "the page shows no training swarm"
    )
    result = subprocess.run(
        [*base, "--hide-scrollbars", "--window-size=1100,1900", f"--screenshot={shot}", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000, (
        f"{shot} is no page screenshot"
    )
    print(f"   {shot} ({shot.stat().st_size // 1024} KiB), {len(set(rows))} peers on the page")


def checkpoints_of(container: str) -> list[int]:
    listed = sh("docker", "exec", container, "ls", "/data/checkpoints", check=False).stdout.split()
    return sorted(int(name.removeprefix("round-")) for name in listed if re.fullmatch(r"round-\d+", name))


def kill_and_watch_restart(compose: Compose, layout: Layout, service: str) -> None:
    """SIGKILL the node process from the host (a crash, as the OOM killer does it: `docker kill`
    would count as a manual stop, which restart policies leave stopped) and watch compose's
    `restart: unless-stopped` bring it back from its volume."""
    port, container = layout.pages[service], compose.container_of(service)
    before = node_status(port)
    saved = wait_until(
        f"{service} has a checkpoint", lambda: (bool(checkpoints_of(container)), checkpoints_of(container)), 300
    )
    facts = inspect(container)
    restarts, round_at_kill = facts["RestartCount"], node_status(port)["round"]
    killed_at = time.time()
    os.kill(facts["State"]["Pid"], signal.SIGKILL)
    print(
        f"   killed {service}'s node (host pid {facts['State']['Pid']}) at round {round_at_kill}; checkpoints {saved}"
    )

    def back() -> tuple[bool, str]:
        state = inspect(container)
        status = node_status(port)
        fresh = status.get("started") and status["started"] > killed_at
        return bool(
            state["RestartCount"] > restarts and fresh
        ), f"restarts {state['RestartCount']}, started {status.get('started')}"

    wait_until(f"compose restarts {service}", back, 180, interval=1.0)
    after = node_status(port)
    assert after["peer_id"] == before["peer_id"], f"{service} came back as {after['peer_id']}, was {before['peer_id']}"

    def trained_on() -> tuple[bool, str]:
        logs = sh("docker", "logs", "--since", f"{killed_at:.0f}", container)
        text = logs.stdout + logs.stderr
        resumed = re.search(r"resumed from /data/checkpoints/round-(\d+) at round (\d+)", text)
        if not resumed:
            return False, "no 'resumed from' line yet"
        start = int(resumed.group(2))
        return bool(re.search(rf"round {start + 1}: ", text[resumed.end() :])), start

    resumed_round = wait_until(f"{service} resumes and trains its next round", trained_on, 180)
    # the last checkpoint before the kill, or one the node finished in the moment before it
    assert saved[-1] <= resumed_round <= round_at_kill + 1 and resumed_round in checkpoints_of(container), (
        f"{service} resumed at round {resumed_round}, not from its last checkpoint ({saved[-1]}..{round_at_kill})"
    )
    print(
        f"   {service} came back (restart count {inspect(container)['RestartCount']}) as {after['peer_id']}, "
        f"resumed from its checkpoint at round {resumed_round} (it had reached {round_at_kill}) and trained round "
        f"{resumed_round + 1}"
    )


def docker_time(stamp: str) -> datetime:
    """Docker's RFC 3339 times carry nanoseconds; Python reads microseconds."""
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00"))


def stop_cleanly(compose: Compose) -> None:
    """`docker-compose stop`: SIGTERM, then SIGKILL (exit 137) after the service's stop timeout.
    Each sapo program's time from receiving SIGTERM to its exit, from its log and the engine."""
    containers = {service: compose.container_of(service) for service in SERVICES}
    started, since = time.monotonic(), f"{time.time() - 5:.0f}"
    compose("stop")
    print(f"   docker-compose stop took {time.monotonic() - started:.1f}s")
    unclean = {}
    for service, container in containers.items():
        state = inspect(container)["State"]
        logs = sh("docker", "logs", "--timestamps", "--since", since, container)
        signalled = SIGTERM_LINE.findall(logs.stdout + logs.stderr)
        took = (
            f"{(docker_time(state['FinishedAt']) - docker_time(signalled[-1])).total_seconds():.1f}s after SIGTERM"
            if signalled
            else ""
        )
        print(f"   {service:<10} exit {state['ExitCode']} {took}")
        if state["ExitCode"] != 0:
            unclean[service] = state["ExitCode"]
    assert not unclean, f"not stopped cleanly by SIGTERM within the stop timeout: {unclean}"


def check_nothing_left(before: dict[str, set[str]]) -> None:
    after = snapshot()
    left = {kind: sorted(after[kind] - before[kind]) for kind in before if after[kind] - before[kind]}
    assert not left, f"left behind after down -v: {left}"


def run(out: Path) -> None:
    clock = Clock()
    layout = Layout.from_override()
    with clock.phase("packages (apt)"):
        print(f"   installed: {engine.install_missing_packages() or 'nothing, all present'}")
    with engine.docker_engine(out / "dockerd.log") as how:
        print(f"   engine: {how}")
        with clock.phase("base image (debootstrap, cached)"):
            print(f"   {'built' if engine.ensure_base_image() else 'cached'}: {engine.BASE_IMAGE}")
        with clock.phase("images (docker build)"):
            print(f"   staged: {engine.stage_build_inputs()}")
            engine.build_images()
        file, dropped = merged_compose_file(out)
        compose = Compose(file)
        # A run killed before its `down` leaves its containers, and their restart policy brings
        # them back with dockerd, holding the swarm's ports and the old volumes: clear them first.
        compose("down", "-v", "--remove-orphans", check=False)
        before = snapshot()
        try:
            with clock.phase("compose up"):
                bring_up(compose, layout, dropped)
            with clock.phase("swarm trades groups"):
                statuses = wait_for_swarm(layout)
                check_containers(compose)
            with clock.phase("judge scores"):
                wait_for_judge(compose, [s["peer_id"] for s in statuses.values()])
            with clock.phase("health checks"):
                wait_healthy(compose)
            with clock.phase("prometheus"):
                check_prometheus(layout, out)
            with clock.phase("page screenshot"):
                screenshot_page(
                    f"http://127.0.0.1:{layout.pages['bootstrap']}/", out / "page-compose.png", out / "chromium"
                )
            with clock.phase("kill and restart"):
                kill_and_watch_restart(compose, layout, VICTIM)
            with clock.phase("stop (SIGTERM)"):
                stop_cleanly(compose)
        finally:
            (out / "compose.log").write_text(compose("logs", "--no-color", "--timestamps", check=False).stdout)
            with clock.phase("down -v"):
                compose("down", "-v", "--remove-orphans", check=False)
        check_nothing_left(before)
    print(clock.table())
    (out / "timings.json").write_text(json.dumps(clock.phases, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=engine.REPO / "compose-test-out", help="logs, screenshot, timings")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the compose test runs apt-get and dockerd: run it as root (CI's .ci/run does)", file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    run(out)
    print(f"compose test passed; logs and screenshot in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
