"""`sapo-node swarm`: N real node processes on 127.0.0.1, wired to each other over libp2p.

Each node is a separate `sapo-node start` with its own data directory, so this is exactly
what N machines would run, squeezed onto one. Each serves its live page on a port of its
own; the swarm prints where, and where each node's log is.

Node 0 loads the model before the others start: they share its converted model and warm
start (models/), and converting it N times at once on the same cores would only be slower.

Each node's output (stdout and stderr, in the order it wrote them) goes to its node.log, which
the swarm rotates: at NODE_LOG_MAX_BYTES it becomes node.log.1 (node.log.1 becomes .2, and so
on), and NODE_LOG_BACKUPS old files are kept, so a swarm left running for weeks holds at most
(NODE_LOG_BACKUPS + 1) x NODE_LOG_MAX_BYTES of log per node.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import trio

from sapo.node.core.metrics import METRICS_FILE
from sapo.node.core.settings import SettingsError

log = logging.getLogger("sapo.swarm")

LISTEN_LINE = re.compile(r"^listening on (/ip4/127\.0\.0\.1/\S+/p2p/\S+)$")
PAGE_LINE = re.compile(r"^page on (http://\S+)$")
READY_LINE = re.compile(r"^model loaded in ")
FORBIDDEN_NODE_FLAGS = ("--data-dir", "--listen", "--peers", "--seed")
# node.log is rotated at this size, and this many old ones are kept (node.log.1 is the newest):
# 30 MiB per node at most. A `make run` node wrote about 14 KB an hour (a line a round), so
# the cap is for what a long run can add: DEBUG logging, a peer whose groups are all refused.
NODE_LOG_MAX_BYTES = 10 << 20
NODE_LOG_BACKUPS = 2
MAX_LINE_BYTES = 64 << 10  # output without a newline for this long is written as it is
METRICS_TAIL_BYTES = 256 << 10  # room for a round record of a swarm of thousands of peers (about 1 KB with 2)


class NodeLog:
    """A node's node.log, rotated by size (logging's RotatingFileHandler, fed whole lines)."""

    def __init__(self, path: Path, max_bytes: int, backups: int):
        self._file = logging.handlers.RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", errors="replace"
        )
        self._file.terminator = ""  # the lines keep their own newlines

    def write(self, text: str) -> None:
        # Line by line, so a file ends between lines and passes the cap only by a line longer
        # than the cap itself; a bare record: the text is written as it is (no %-interpolation).
        for line in text.splitlines(keepends=True):
            self._file.emit(logging.makeLogRecord({"msg": line}))

    def close(self) -> None:
        self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.stream is None


def check_swarm_flags(node_args: list[str]) -> None:
    bad = [a for a in node_args if a.split("=")[0] in FORBIDDEN_NODE_FLAGS]
    if bad:
        raise SettingsError(
            f"invalid settings:\n  {' '.join(bad)}: the swarm sets {', '.join(FORBIDDEN_NODE_FLAGS)} per node itself; remove them"
        )


@dataclass
class SwarmMember:
    index: int
    data_dir: Path
    process: trio.Process | None = None
    log: NodeLog | None = None
    page: str | None = None
    # Set when the node has loaded its model (or exited).
    ready: trio.Event = field(default_factory=trio.Event)

    @property
    def exit_code(self) -> int | None:
        """The node's exit code; None while it runs (a member is started before it is awaited)."""
        assert self.process is not None, f"node {self.index} was never started"
        return self.process.returncode

    @property
    def log_path(self) -> Path:
        return self.data_dir / "node.log"

    def note(self, text: str) -> None:
        """A line from the swarm itself in the node's log, so the log tells the whole story."""
        if self.log is not None and not self.log.closed:
            self.log.write(f"sapo-swarm: {text}\n")


def metrics_ports(node_args: list[str], nodes: int) -> tuple[list[str], list[int]]:
    """The node flags without --metrics-port, and each node's port: the one given plus the
    node's index (one port cannot serve N pages), or any free port (0) for each."""
    args, base = [], 0
    it = iter(node_args)
    for arg in it:
        if arg == "--metrics-port":
            base = int(next(it, "0"))
        elif arg.startswith("--metrics-port="):
            base = int(arg.split("=", 1)[1])
        else:
            args.append(arg)
    return args, [base + i if base else 0 for i in range(nodes)]


def node_command(
    member: SwarmMember,
    node_args: list[str],
    seed: int,
    peers: list[str],
    nodes: int,
    models_dir: Path,
    metrics_port: int = 0,
) -> list[str]:
    # --stop-with-parent: the node stops cleanly once this swarm is gone, however it went
    args = [sys.executable, "-m", "sapo.node.cli", "start", *node_args, "--stop-with-parent", str(os.getpid())]
    args += ["--data-dir", str(member.data_dir), "--listen", "/ip4/127.0.0.1/tcp/0", "--seed", str(seed + member.index)]
    args += ["--metrics-port", str(metrics_port)]
    if not any(a.startswith("--models-dir") for a in node_args):
        # one converted model and warm-start cache for the whole swarm
        args += ["--models-dir", str(models_dir)]
    if not any(a.startswith("--wait-for-peers") for a in node_args):
        # nodes launched together start together; a late or dead one only delays the rest a little
        args += ["--wait-for-peers", str(nodes - 1)]
    if not any(a.startswith("--torch-threads") for a in node_args):
        # Several nodes share the cores: one torch thread each beats oversubscription by far.
        args += ["--torch-threads", "1"]
    if peers:
        args += ["--peers", *peers]
    return args


def latest_metrics(data_dir: Path) -> dict | None:
    """The last whole round record. Only the file's tail is read: metrics.jsonl grows a line a
    round, and the progress line reads it every few seconds for as long as the swarm runs."""
    path = data_dir / METRICS_FILE
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - METRICS_TAIL_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def progress_line(members: list[SwarmMember]) -> str:
    parts = []
    for m in members:
        row = latest_metrics(m.data_dir)
        if row is None:
            parts.append(f"n{m.index}: starting")
        else:
            parts.append(
                f"n{m.index}: r{row['round']} reward {row['reward_mean']:.2f} ext {row['external_groups']} "
                f"peers {len(row.get('peers', []))}"
            )
    return " | ".join(parts)


async def _start_member(member: SwarmMember, command: list[str], *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run one node; report its listen address once it has printed that and its page, and
    relay nothing else (its output goes to its log)."""
    member.data_dir.mkdir(parents=True, exist_ok=True)
    member.log = log_file = NodeLog(member.log_path, NODE_LOG_MAX_BYTES, NODE_LOG_BACKUPS)
    # stderr into the same pipe: the node's prints and its log lines land in the order they happened.
    # Its own session: the terminal's Ctrl-C reaches the swarm, which forwards it.
    process = await trio.lowlevel.open_process(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    member.process = process
    assert process.stdout is not None  # opened with stdout=PIPE
    address = None
    buffer = b""
    try:
        async for chunk in process.stdout:
            *lines, buffer = (buffer + chunk).split(b"\n")
            # Whole lines only: the swarm's own notes go to the same file between them.
            if lines:
                log_file.write(b"".join(line + b"\n" for line in lines).decode(errors="replace"))
            if len(buffer) > MAX_LINE_BYTES:  # no newline in sight (a progress bar's \r updates): write it as it is
                log_file.write(buffer.decode(errors="replace"))
                buffer = b""
            for line in (raw.decode(errors="replace").strip() for raw in lines):
                if address is None and (match := LISTEN_LINE.match(line)):
                    address = match.group(1)
                elif member.page is None and (match := PAGE_LINE.match(line)):
                    member.page = match.group(1)
                    if address is not None:
                        task_status.started(address)  # the page line follows the listening lines
                elif READY_LINE.match(line):
                    member.ready.set()
        log_file.write(buffer.decode(errors="replace"))
        await process.wait()
    finally:
        member.ready.set()
        log_file.close()
    if member.page is None:
        raise RuntimeError(
            f"node {member.index} exited (code {process.returncode}) before listening; see {member.log_path}"
        )


async def _stop(members: list[SwarmMember], timeout: float, why: str | None = None) -> None:
    for m in members:
        if m.process is not None and m.process.returncode is None:
            if why:
                m.note(f"{why}; sending this node SIGTERM")
            m.process.send_signal(signal.SIGTERM)
    with trio.move_on_after(timeout):
        for m in members:
            if m.process is not None:
                await m.process.wait()
    for m in members:
        if m.process is not None and m.process.returncode is None:
            log.warning("node %d did not stop in %.0fs; killing it", m.index, timeout)
            m.process.kill()
            await m.process.wait()


async def run_swarm(
    nodes: int,
    data_dir: Path,
    node_args: list[str],
    seed: int = 0,
    progress_every: float = 5.0,
    stop_timeout: float = 600.0,
) -> int:
    """Start the nodes, show progress until they all finish, stop them all on Ctrl-C.
    Returns the number of nodes that failed."""
    check_swarm_flags(node_args)
    node_args, ports = metrics_ports(node_args, nodes)
    members = [SwarmMember(i, data_dir / f"node-{i}") for i in range(nodes)]
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                # A node mid-update finishes its step so its checkpoint matches a whole round;
                # with a large model that can take minutes, so a second Ctrl-C kills at once.
                stopping = False
                async for signum in signals:
                    if not stopping:
                        stopping = True
                        what = "you pressed Ctrl-C" if signum == signal.SIGINT else "the swarm received SIGTERM"
                        print(
                            f"stopping the swarm ({what}): each node gets SIGTERM and finishes its current step "
                            "(Ctrl-C again to kill them now)...",
                            flush=True,
                        )
                        nursery.start_soon(_stop, members, stop_timeout, f"{what} in the swarm's terminal")
                    else:
                        print("killing the swarm's nodes", flush=True)
                        for m in members:
                            if m.process is not None and m.process.returncode is None:
                                m.process.kill()
                        return

            nursery.start_soon(stop_on_signal)
            try:
                async with trio.open_nursery() as node_nursery:
                    # Each node dials every node started before it: a full mesh of connections,
                    # so no single process is a bridge the others depend on.
                    addresses: list[str] = []
                    for m in members:
                        command = node_command(
                            m, node_args, seed, list(addresses), nodes, data_dir / "models", ports[m.index]
                        )
                        addresses.append(await node_nursery.start(_start_member, m, command))
                        if m.index == 0:
                            print(f"bootstrap node: {addresses[0]}", flush=True)
                        print(f"node {m.index}: page {m.page}  log {m.log_path}", flush=True)
                        if m.index == 0 and nodes > 1:
                            others = "node 1 starts" if nodes == 2 else f"nodes 1-{nodes - 1} start"
                            print(
                                f"{others} once node 0 has loaded the model they share (its page shows the progress)",
                                flush=True,
                            )
                            await m.ready.wait()
                            if m.exit_code is not None:
                                raise RuntimeError(
                                    f"node 0 exited (code {m.exit_code}) while loading; see {m.log_path}"
                                )
                    node_nursery.start_soon(_report, members, progress_every)
                    # trio has no event for "a child exited" short of waiting on each: poll
                    while any(m.exit_code is None for m in members):  # noqa: ASYNC110
                        await trio.sleep(0.5)
                    node_nursery.cancel_scope.cancel()
            finally:
                # Whatever ended the swarm (a node failing to start, an error), no child outlives it.
                with trio.CancelScope(shield=True):
                    await _stop(members, stop_timeout)
            nursery.cancel_scope.cancel()
    print(progress_line(members), flush=True)
    failed = [m.index for m in members if m.process is not None and m.process.returncode not in (0, -signal.SIGTERM)]
    for index in failed:
        print(f"node {index} failed; see {members[index].log_path}", file=sys.stderr)
    return len(failed)


async def _report(members: list[SwarmMember], every: float, quiet_limit: float = 60.0) -> None:
    """A progress line when something changed, and at least once a minute otherwise."""
    last, quiet = "", 0.0
    while True:
        await trio.sleep(every)
        line = progress_line(members)
        quiet += every
        if line != last or quiet >= quiet_limit:
            print(line, flush=True)
            last, quiet = line, 0.0
