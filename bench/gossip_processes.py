"""The gossip benchmark with one OS process per node (bench/gossip.py --processes): the launcher and its children.

The parent builds every node's groups, starts bench/gossip.py again as each child (`--child`),
reads `listening <addr>` and `ready` from each, sends them all `go <unix time>` and merges the
records they write into the totals that bench/gossip_report.py prints.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import trio

from bench.gossip_groups import build_groups
from bench.gossip_swarm import BenchNode, Totals, gossip_settings, publish_rounds

ROOT = Path(__file__).resolve().parents[1]  # where `python -m bench.gossip` runs its children
# A child imports libp2p (~2.5 s of CPU); 32 of them on 2 cores that other jobs keep busy take minutes.
CHILD_START_SECONDS_PER_NODE = 20.0


def child_main(args: argparse.Namespace) -> int:
    """One node of a --processes swarm: prints `listening <addr>`, then `ready` once connected,
    waits for `go <unix time>` on stdin, publishes, drains and writes its record as JSON."""
    trio.run(_child, args)
    return 0


async def _child(args: argparse.Namespace) -> None:
    from sapo.protocol.network import serve_network
    from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of
    from sapo.protocol.wire.codec import DecodeLimits, Rejected, decode
    from sapo.training.problems.rollouts import QuestionGroup
    from sapo.training.problems.tasks import reasoning_gym_version

    index, out_dir = args.child, args.child_dir
    key_pair = load_or_create_identity(out_dir / f"node-{index}")
    send, incoming = trio.open_memory_channel(4096)
    peers = [args.bootstrap] if args.bootstrap else []
    # The parent built every node's groups: importing reasoning-gym here would double a child's start.
    groups = [QuestionGroup.model_validate(g) for g in json.loads((out_dir / f"groups-{index}.json").read_text())]
    totals = Totals()
    received: list[tuple[str, float]] = []
    limits = DecodeLimits()

    async def record_receipts() -> None:
        async for message in incoming:
            try:
                decode(message.data, limits)  # the CPU a node's intake spends before its checks
            except Rejected:
                totals.decode_rejected += 1
                continue
            received.append((hashlib.sha1(message.data).hexdigest(), message.received_at))

    async with trio.open_nursery() as nursery:
        settings = gossip_settings(args, peers, args.discover_peers > 0)
        service = await nursery.start(partial(serve_network, settings, key_pair, send))
        node = BenchNode(
            index=index,
            peer_id=peer_id_of(key_pair),
            service=service,
            groups=groups,
            incoming=incoming,
            rg_version=reasoning_gym_version(),
        )
        print(f"listening {service.listen_addrs[0]}", flush=True)
        nursery.start_soon(record_receipts)
        while not service.connected_peers():
            await trio.sleep(0.1)
        print("ready", flush=True)
        line = await trio.to_thread.run_sync(sys.stdin.readline)  # "go <unix time>" from the parent
        await trio.sleep(max(0.0, float(line.split()[1]) - time.time()))
        cpu0 = time.process_time()
        await publish_rounds(node, args, totals, time.monotonic() + args.seconds)
        links = len(service.connected_peers())  # now: after the drain, some peers have already left
        await trio.sleep(args.drain_seconds)
        record = {
            "published": [(hashlib.sha1(frame).hexdigest(), sent) for frame, sent in totals.sent_at.items()],
            "publish_failed": totals.publish_failed,
            "received": received,
            "decode_rejected": totals.decode_rejected,
            "frame_bytes": totals.frame_bytes,
            "text_bytes": totals.text_bytes,
            "cpu_s": time.process_time() - cpu0,
            "counters": service.counters,
            "links": links,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        (out_dir / f"result-{index}.json").write_text(json.dumps(record))
        nursery.cancel_scope.cancel()


class LineReader:
    """Lines from a child's stdout with a deadline. select() sees only the OS pipe, so read the
    raw fd into our own buffer: a buffered readline() may swallow the next line, and select()
    would then wait for it forever."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.buffer = b""

    def line(self, deadline: float, what: str) -> str:
        import select

        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out waiting for {what}")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError(f"a node exited while we waited for {what} (code {self.proc.wait()})")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode().strip()


def child_command(args: argparse.Namespace, tmp: str, discover: bool) -> list[str]:
    """The command line every child shares (bench/gossip.py's own), less its index and bootstrap."""
    return [
        sys.executable,
        "-m",
        "bench.gossip",  # each child is the benchmark's own command line
        "--child-dir",
        tmp,
        "--nodes",
        str(args.nodes),
        "--seconds",
        str(args.seconds),
        "--groups-per-round",
        str(args.groups_per_round),
        "--round-seconds",
        str(args.round_seconds),
        "--drain-seconds",
        str(args.drain_seconds),
        "--seed",
        str(args.seed),
        "--discover-peers",
        str(args.discover_peers if discover else 0),
    ]


def write_group_pools(args: argparse.Namespace, tmp: str) -> None:
    """Each child's pool of groups to publish, built here once so that no child pays for it."""
    for i in range(args.nodes):
        pool = [group.model_dump(mode="json") for group in build_groups(i, args.seed)]
        (Path(tmp) / f"groups-{i}.json").write_text(json.dumps(pool))


def start_children(
    args: argparse.Namespace,
    common: list[str],
    logs: list,
    children: list[subprocess.Popen],
    readers: list[LineReader],
    deadline: float,
) -> None:
    """Start the children (each appended to `children` and `readers` at once, for the caller to
    kill on failure) and wait until every one listens and has connected."""
    addresses: list[str] = []

    def start(i: int) -> LineReader:
        bootstrap = [] if i == 0 else ["--bootstrap", addresses[0 if args.topology == "star" else i - 1]]
        proc = subprocess.Popen(
            [*common, "--child", str(i), *bootstrap],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=logs[i],
            bufsize=0,
            cwd=ROOT,
        )
        children.append(proc)
        readers.append(LineReader(proc))
        return readers[-1]

    # A star's leaves need only the hub's address: start them all at once. A chain goes one by one.
    addresses.append(start(0).line(deadline, "node 0 to listen").split()[1])
    if args.topology == "star":
        for i in range(1, args.nodes):
            start(i)
        addresses += [
            reader.line(deadline, f"node {i} to listen").split()[1] for i, reader in enumerate(readers[1:], 1)
        ]
    else:
        for i in range(1, args.nodes):
            addresses.append(start(i).line(deadline, f"node {i} to listen").split()[1])
    for i, reader in enumerate(readers):
        try:
            reader.line(deadline, f"node {i} to connect")
        except TimeoutError as error:
            logs[i].flush()
            tail = Path(logs[i].name).read_text()[-3000:]
            raise TimeoutError(f"{error}; its log ends:\n{tail}") from None


def publish_and_wait(args: argparse.Namespace, children: list[subprocess.Popen], logs: list) -> None:
    """Tell every child when to start publishing, and wait for each to finish and exit cleanly."""
    go = time.time() + args.settle_seconds
    for proc in children:
        proc.stdin.write(f"go {go}\n".encode())
        proc.stdin.flush()
    for i, proc in enumerate(children):
        code = proc.wait(timeout=args.settle_seconds + args.seconds + args.drain_seconds + 60)
        if code != 0:
            raise RuntimeError(f"node {i} exited with {code}: {Path(logs[i].name).read_text()[-2000:]}")


def run_processes(args: argparse.Namespace, discover: bool) -> dict:
    """N child processes in a star (or chain) on 127.0.0.1; their records are merged here."""
    phases: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sapo-bench-gossip-") as tmp:
        common = child_command(args, tmp, discover)
        started = time.monotonic()
        write_group_pools(args, tmp)
        phases["build groups s"] = time.monotonic() - started
        children: list[subprocess.Popen] = []
        readers: list[LineReader] = []
        logs = [open(Path(tmp) / f"node-{i}.log", "w") for i in range(args.nodes)]
        try:
            started = time.monotonic()
            deadline = started + 60 + CHILD_START_SECONDS_PER_NODE * args.nodes
            start_children(args, common, logs, children, readers, deadline)
            phases["start+connect s"] = time.monotonic() - started
            print(
                f"{args.nodes} node processes connected in {phases['start+connect s']:.1f} s; publishing for "
                f"{args.seconds:g} s after {args.settle_seconds:g} s to settle",
                file=sys.stderr,
                flush=True,
            )
            publish_and_wait(args, children, logs)
            records = [json.loads((Path(tmp) / f"result-{i}.json").read_text()) for i in range(args.nodes)]
        finally:
            for proc in children:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for log in logs:
                log.close()
    return merge_records(records, args, phases, discover)


def merge_records(records: list[dict], args: argparse.Namespace, phases: dict, discover: bool) -> dict:
    totals = Totals()
    sent_at: dict[str, float] = {}
    for record in records:
        sent_at.update({digest: sent for digest, sent in record["published"]})
        totals.publish_failed += record["publish_failed"]
        totals.decode_rejected += record["decode_rejected"]
        totals.frame_bytes += record["frame_bytes"]
        totals.text_bytes += record["text_bytes"]
    totals.published = len(sent_at)
    for record in records:
        for digest, received_at in record["received"]:
            if digest in sent_at:
                totals.delivered += 1
                totals.latencies.append(received_at - sent_at[digest])
    counters: dict[str, int] = {}
    for record in records:
        for name, value in record["counters"].items():
            counters[name] = counters.get(name, 0) + value
    return {
        "totals": totals,
        "expected": totals.published * (args.nodes - 1),
        "cpu_s": sum(record["cpu_s"] for record in records),
        "wall_s": args.seconds + args.drain_seconds,
        "counters": counters,
        "phases": phases,
        "max_rss_mb": sum(record["max_rss_mb"] for record in records),
        "links": [record["links"] for record in records],
        "discover": discover,
    }
