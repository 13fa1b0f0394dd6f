"""One gossip-level swarm peer as its own process, and the parent's handle on it.

The peer is the node's network half and nothing else: the real network (`open_network`) with the
settings it is given (relay, reachability, discovery...), publishing real RolloutGroup frames
(`to_wire` + `encode`, as the node's GroupEncoder does) at a fixed rate and decoding every
frame it receives with the real codec. What it leaves out is the model: generating and
training take a node minutes per round and would say nothing about the network. NAT tests and
benchmarks use it to run 10-20 peers on two cores.

    python -m bench.gossip_peer --data-dir D --listen /ip4/0.0.0.0/tcp/4001 \
        --peers /ip4/198.51.100.2/tcp/4001/p2p/12D3KooW... --rate 0.5 --settings '{"relay": "off"}'

It appends one JSON object per line to `--events` (a file, so that a parent that reads late
never stalls it, as a full stdout pipe would): `up` (peer id, listen addresses) once listening,
`pub` and `recv` for every group (sha1 of the frame, time.time()), and `state` every
`--state-seconds` (reachability, relaying, relayed addresses, connections, counters). It
publishes from `--publish-at` (unix time; default: once connected) until SIGTERM or SIGINT,
then closes its host and exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]  # where `python -m bench.gossip_peer` runs
SWARM = "bench"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="identity.key lives here")
    parser.add_argument("--events", type=Path, required=True, help="append JSON event lines here")
    parser.add_argument("--listen", default="/ip4/0.0.0.0/tcp/4001")
    parser.add_argument("--peers", nargs="*", default=[], help="bootstrap peers (any form `peers` accepts)")
    parser.add_argument("--settings", default="{}", help="more NetworkSettings fields, as JSON")
    parser.add_argument("--rate", type=float, default=0.5, help="groups published per second (0 = none)")
    parser.add_argument("--publish-at", type=float, default=None, help="unix time to start publishing")
    parser.add_argument("--publish-seconds", type=float, default=None, help="stop publishing after this long")
    parser.add_argument(
        "--wait-go", action="store_true", help="publish only after a line `go <unix time> <seconds>` on stdin"
    )
    parser.add_argument("--state-seconds", type=float, default=2.0, help="how often to print a state line")
    parser.add_argument(
        "--fetch",
        type=int,
        default=0,
        help="act as a node that fetches (0.4.0): offer our frames with share() instead of gossiping them, "
        "and ask for this many groups every second (0: gossip every frame on the topic, as before)",
    )
    parser.add_argument("--index", type=int, default=0, help="seeds this peer's groups")
    parser.add_argument(
        "--groups-file",
        type=Path,
        default=None,
        help="QuestionGroups as JSON (write_groups); without it they are built here (+1.4 s)",
    )
    return parser.parse_args(argv)


_events = None


def emit(**fields) -> None:
    _events.write(json.dumps({"t": time.time(), **fields}) + "\n")


def connection_kinds(service) -> dict[str, str]:
    """peer id -> "direct", "relayed" or "both" (a hole punch has happened, the relay leg not yet closed)."""
    from sapo.protocol.toolkit.hosts import is_relayed

    host = service.host
    kinds = {}
    network = host.get_network()
    for peer in host.get_connected_peers():
        open_ = [c for c in network.get_connections(peer) if not c.is_closed]
        relayed = {is_relayed(c) for c in open_}
        if relayed:
            kinds[peer.to_base58()] = (
                "both" if relayed == {True, False} else ("relayed" if True in relayed else "direct")
            )
    return kinds


def load_groups(args: argparse.Namespace) -> list:
    """The QuestionGroups this peer publishes: --groups-file's, or built here for --index."""
    if args.groups_file is not None:
        from sapo.training.problems.rollouts import QuestionGroup

        return [QuestionGroup.model_validate(g) for g in json.loads(args.groups_file.read_text())]
    from bench.gossip_groups import build_groups

    return build_groups(args.index, 0)


async def receive_frames(incoming, limits) -> None:
    """Decode every frame that arrives, as a node's intake does, and log it (or its rejection)."""
    from sapo.protocol.wire.codec import Rejected, decode

    async for message in incoming:
        try:
            decode(message.data, limits)  # what a node's intake spends before its checks
        except Rejected:
            emit(ev="rejected", sender=message.sender)
            continue
        emit(ev="recv", id=hashlib.sha1(message.data).hexdigest(), sender=message.sender, at=message.received_at)


async def report_state(args: argparse.Namespace, service) -> None:
    """A `state` line every --state-seconds: CPU, reachability, relaying, connections, counters."""
    while True:
        seen = service.status()
        emit(
            ev="state",
            cpu=time.process_time(),
            reachability=seen.reachability,
            relaying=seen.relaying,
            relayed=seen.relayed_addrs,
            conns=connection_kinds(service),
            counters=service.counters,
        )
        await trio.sleep(args.state_seconds)


async def publish_frames(args: argparse.Namespace, service, node) -> None:
    """From the start time (`go` on stdin, --publish-at, or once connected), --rate frames a
    second until --publish-seconds have passed (or forever)."""
    if args.rate <= 0:
        return
    if args.wait_go:
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        _, at, seconds = line.split()
        args.publish_at, args.publish_seconds = float(at), float(seconds)
    if args.publish_at is None:
        while not service.connected_peers():
            await trio.sleep(0.2)
    else:
        await trio.sleep(max(0.0, args.publish_at - time.time()))
    k = 0
    next_at = time.monotonic()
    stop_at = next_at + args.publish_seconds if args.publish_seconds is not None else float("inf")
    while time.monotonic() < stop_at:
        frame = node.frame(node.groups[k % len(node.groups)], k)
        sent = time.time()
        ok = await (service.share(frame, k) if args.fetch > 0 else service.publish(frame))
        emit(ev="pub", id=hashlib.sha1(frame).hexdigest(), at=sent, ok=ok)
        k += 1
        next_at += 1.0 / args.rate
        await trio.sleep(max(0.0, next_at - time.monotonic()))


async def ask_for_groups(service, count: int) -> None:
    """What a fetching node's rounds do, once a second: ask for `count` groups."""
    while True:
        service.want(count)
        await trio.sleep(1.0)


async def peer_main(args: argparse.Namespace) -> None:
    from bench.gossip_swarm import BenchNode
    from sapo.protocol.network import open_network
    from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of
    from sapo.protocol.settings import NetworkSettings
    from sapo.protocol.wire.codec import DecodeLimits
    from sapo.training.problems.tasks import reasoning_gym_version

    key_pair = load_or_create_identity(args.data_dir)
    settings = NetworkSettings(
        # a gossip peer gossips (in fetch mode the topic takes only older releases' groups); with
        # --fetch it is a 0.4.0 node, which shares and asks instead
        **{
            "listen": args.listen,
            "peers": args.peers,
            "swarm": SWARM,
            "exchange": "fetch" if args.fetch else "gossip",
            **json.loads(args.settings),
        }
    )
    send, incoming = trio.open_memory_channel(4096)
    groups = load_groups(args)
    limits = DecodeLimits()

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_network(settings, key_pair, send) as service, trio.open_nursery() as nursery:
            node = BenchNode(
                index=args.index,
                peer_id=peer_id_of(key_pair),
                service=service,
                groups=groups,
                incoming=incoming,
                rg_version=reasoning_gym_version(),
            )
            emit(ev="up", peer_id=service.peer_id, listen=service.listen_addrs)
            nursery.start_soon(receive_frames, incoming, limits)
            nursery.start_soon(report_state, args, service)
            nursery.start_soon(publish_frames, args, service, node)
            if args.fetch > 0:
                nursery.start_soon(ask_for_groups, service, args.fetch)
            async for _ in signals:
                emit(ev="stopping")
                nursery.cancel_scope.cancel()
                break


def write_groups(path: Path, index: int = 0, **size) -> Path:
    """One pool of real groups for every peer to publish (each peer's frames still differ:
    its peer id, round and time are in them); saves every child the reasoning-gym import."""
    from bench.gossip_groups import build_groups

    path.write_text(json.dumps([g.model_dump(mode="json") for g in build_groups(index, 0, **size)]))
    return path


class PeerProcess:
    """A gossip_peer.py child (optionally inside a namespace); its event lines are collected.
    `module` runs another program with the same command line and event lines instead
    (tests/support/standard_peer.py: a standard libp2p peer)."""

    def __init__(
        self,
        name: str,
        data_dir: Path,
        *,
        prefix: list[str] = (),
        listen: str = "/ip4/0.0.0.0/tcp/4001",
        peers: list[str] = (),
        settings: dict | None = None,
        rate: float = 0.5,
        publish_at: float | None = None,
        index: int = 0,
        log_dir: Path | None = None,
        groups_file: Path | None = None,
        publish_seconds: float | None = None,
        wait_go: bool = False,
        state_seconds: float | None = None,
        fetch: int = 0,
        module: str = "bench.gossip_peer",
    ):
        self.name = name
        self.events: list[dict] = []
        self._buffer = b""
        log_dir = log_dir or data_dir.parent
        self.log = open(log_dir / f"{name}.log", "w")
        self.events_path = log_dir / f"{name}.events.jsonl"
        self.events_path.write_bytes(b"")
        self._events_file = open(self.events_path, "rb")
        cmd = [
            *prefix,
            sys.executable,
            "-m",
            module,
            "--data-dir",
            str(data_dir),
            "--events",
            str(self.events_path),
            "--listen",
            listen,
            "--rate",
            str(rate),
            "--index",
            str(index),
            "--settings",
            json.dumps(settings or {}),
        ]
        if peers:
            cmd += ["--peers", *peers]
        if publish_at is not None:
            cmd += ["--publish-at", str(publish_at)]
        if groups_file is not None:
            cmd += ["--groups-file", str(groups_file)]
        if publish_seconds is not None:
            cmd += ["--publish-seconds", str(publish_seconds)]
        if wait_go:
            cmd.append("--wait-go")
        if state_seconds is not None:
            cmd += ["--state-seconds", str(state_seconds)]
        if fetch:
            cmd += ["--fetch", str(fetch)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=self.log, stderr=self.log, bufsize=0, cwd=ROOT)
        self.started_at = time.time()
        self.stopped_at: float | None = None
        self.peer_id: str | None = None

    def poll(self) -> None:
        """Read whatever the child has written so far (never blocks)."""
        if not self._events_file.closed:
            self._buffer += self._events_file.read()
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            self.events.append(event)
            if event.get("ev") == "up":
                self.peer_id = event["peer_id"]

    def wait_up(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while self.peer_id is None:
            self.poll()
            if self.proc.poll() is not None and self.peer_id is None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not come up in {timeout:g} s: {self.log_tail()}")
            time.sleep(0.05)
        return self.peer_id

    def go(self, at: float, seconds: float) -> None:
        """Start publishing at unix time `at` for `seconds` (with wait_go)."""
        self.proc.stdin.write(f"go {at} {seconds}\n".encode())
        self.proc.stdin.flush()

    def last_state(self) -> dict | None:
        self.poll()
        return next((e for e in reversed(self.events) if e.get("ev") == "state"), None)

    def of(self, kind: str) -> list[dict]:
        self.poll()
        return [e for e in self.events if e.get("ev") == kind]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-chars:]

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stopped_at = self.stopped_at or time.time()
        self.poll()
        self._events_file.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.log.close()
        return self.proc.returncode


def main(argv: list[str] | None = None) -> int:
    global _events
    args = parse_args(argv)
    with open(args.events, "a", buffering=1) as _events:  # line-buffered: the parent sees each event
        trio.run(peer_main, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
