"""Real `sapo-node` processes for the tests: the CLI run to its end (`sapo_node`), or a node
started through it (`NodeProcess`), optionally inside a network namespace, with its "listening
on" and "page on" lines parsed for the addresses peers dial and a browser opens."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

LOOPBACK_LISTEN = "/ip4/127.0.0.1/tcp/0"

# Small, fast node settings for tests that exercise the daemon rather than learning; each test
# that picks its own address takes TINY, the rest FAST_TINY.
TINY = [
    "--model",
    "tiny",
    "--tasks",
    "basic_arithmetic",
    "--max-new-tokens",
    "24",
    "--generations",
    "4",
    "--warm-start-steps",
    "0",
    "--torch-threads",
    "1",
]
FAST_TINY = [*TINY, "--listen", LOOPBACK_LISTEN]


def sapo_node(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "sapo.node.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def read_metrics(data_dir: Path) -> list[dict]:
    path = data_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


def wait_for(predicate, timeout: float, interval: float = 0.5, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


LISTEN = re.compile(r"listening on (/ip4/[\d.]+/tcp/\d+/p2p/(\w+))")
PAGE = re.compile(r"^page on (http://\S+)$")

# The untrained tiny model scores 0 on every completion, so its groups carry no signal and a
# receiver refuses them (`no_signal`) unless it adds completions of its own to peers' questions
# (--augment-external); with that and the uniform sampler, tests watch the plumbing.
PLUMBING = ["--local", "2", "--external", "2", "--sampler", "uniform", "--augment-external", "1", "--rounds", "0"]
# A node that takes groups on the rollouts topic (`--exchange gossip`, as releases before 0.4.0
# did): the path a stranger's published frames meet, and an older release's groups in a mixed
# swarm. With the default, fetching, a group on the topic from anyone but an older release is
# refused before any check (tests/protocol/test_group_fetch.py), so a test of the checks behind
# the topic asks for this path.
TOPIC_PATH = ["--exchange", "gossip"]
# PLUMBING without --augment-external: a node that cannot learn from a group of equal rewards
NO_AUGMENT = [arg for arg in PLUMBING if arg not in ("--augment-external", "1")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NodeProcess:
    """One node; `prefix` runs it under another command (e.g. `ip netns exec NS`), `python` is
    the interpreter of the sapo release to run (this one by default; tests/support/releases.py)."""

    def __init__(
        self,
        data_dir: Path,
        args: list[str],
        *,
        prefix: list[str] = (),
        listen: str = "/ip4/127.0.0.1/tcp/0",
        start_timeout: float = 120,
        python: str | Path = sys.executable,
    ):
        self.data_dir = data_dir
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.log = self.log_path.open("a")
        # -P: `-m` would put the working directory first on sys.path, and this checkout's
        # sapo.egg-info there would make another release's node report this release's version.
        isolated = ["-P"] if Path(python) != Path(sys.executable) else []
        cmd = [
            *prefix,
            str(python),
            *isolated,
            "-m",
            "sapo.node.cli",
            "start",
            *TINY,
            "--listen",
            listen,
            "--data-dir",
            str(data_dir),
            *args,
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        match = wait_for(self._listen_line, timeout=start_timeout, interval=0, what=f"{data_dir.name} to listen")
        self.address, self.peer_id = match.group(1), match.group(2)

    def _listen_line(self):
        line = self.proc.stdout.readline()
        if not line and self.proc.poll() is not None:
            raise AssertionError(f"node exited early with code {self.proc.returncode}:\n{self.log_text()[-3000:]}")
        return LISTEN.search(line)

    def log_text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()

    def metrics(self) -> list[dict]:
        return read_metrics(self.data_dir)

    def last_round(self) -> int:
        return max((r["round"] for r in self.metrics()), default=0)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> None:
        stop_process(self.proc, sig, timeout)
        if self.proc.stdout:
            self.proc.stdout.close()
        self.log.close()


def stop_process(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 30) -> int:
    """Signal a child and wait; kill it if it does not exit in time. Returns its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def wait_rounds(node: NodeProcess, more: int, timeout: float) -> int:
    target = node.last_round() + more
    wait_for(
        lambda: node.last_round() >= target or not node.alive() and _died(node),
        timeout,
        interval=0.2,
        what=f"{node.data_dir.name} to reach round {target}",
    )
    return node.last_round()


def _died(node: NodeProcess):
    raise AssertionError(f"{node.data_dir.name} died:\n{node.log_text()[-3000:]}")


def since(rows: list[dict], t: float) -> list[dict]:
    return [r for r in rows if r["time"] > t]


def deadline(seconds: float) -> float:
    return time.monotonic() + seconds


def with_peers(args: list[str], peers: list[str]) -> list[str]:
    return [*args, "--peers", *peers] if peers else list(args)


def start_node(data_dir, peers: list[str], extra: list[str]) -> NodeProcess:
    return NodeProcess(data_dir, with_peers(extra, peers))


def page_url(node: NodeProcess) -> str:
    """The `page on` line, which the node prints right after its `listening on` lines."""
    return wait_for(lambda: _match(PAGE, node.proc.stdout.readline()), timeout=60, interval=0, what="the page address")


def _match(pattern, line):
    match = pattern.match(line.strip())
    return match.group(1) if match else None
