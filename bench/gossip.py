"""Gossip N nodes' rollout groups over the real GossipService on 127.0.0.1.

By default all N nodes run in this one trio process (one libp2p host each, its own Ed25519
identity from `protocol.identity` in a temp dir), so every number here is N nodes sharing one
Python interpreter: latency includes waiting for the other nodes' work, and the CPU figure is
the whole swarm's. With `--processes` each node is its own OS process (this script, re-run as
a child), as in a real swarm. Nodes connect in a star (every node dials node 0, the bootstrap
peer) or a chain (node i dials node i-1); with `--discovery on` (the node's default) they also
find and dial each other through `/sapo/peers/1` (protocol/discovery.py), `off` keeps only the
bootstrap links, and `both` runs the swarm twice and prints the two side by side.

Every node publishes `--groups-per-round` real RolloutGroup frames (`to_wire` + `encode`, as
`node.exchange.GroupEncoder.frame` does) every `--round-seconds`, each node at its own phase in the
round. A group is one easy basic_arithmetic question with 8 completions of about 1,000
characters of reasoning-like text ending in <answer>N</answer>. Receivers decode every frame
with the real codec (bounded, validated), as a node's intake does before its checks.

    .venv/bin/python bench/gossip.py                 # 8 nodes, 30 s
    .venv/bin/python bench/gossip.py --nodes 3 --topology chain
    .venv/bin/python bench/gossip.py --nodes 16 --processes --discovery both
    .venv/bin/python bench/gossip.py --smoke         # 3 nodes, 5 s

Latency is from just before `publish()` to the receiving node's `received_at` (the same
clock: time.time() on one machine). Delivery ratio = delivered / (published x (N - 1)); after the last publish the
nodes get `--drain-seconds` to finish delivering.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

SWARM = "bench"
SWARM = "bench"
COMPLETIONS_PER_GROUP = 8
COMPLETION_CHARS = 1_000  # about 256 tokens of SmolLM2 text
GROUPS_PER_NODE_POOL = 8  # distinct questions per node, reused round after round


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8, help="number of nodes (hosts) in this process")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the nodes publish")
    parser.add_argument("--groups-per-round", type=int, default=4, help="groups each node publishes per round")
    parser.add_argument("--round-seconds", type=float, default=2.0, help="seconds between a node's rounds")
    parser.add_argument("--topology", choices=("star", "chain"), default="star", help="who dials whom")
    parser.add_argument("--settle-seconds", type=float, default=3.0, help="wait after connecting, for the mesh")
    parser.add_argument("--drain-seconds", type=float, default=5.0, help="max wait for deliveries after the last publish")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated text")
    parser.add_argument("--processes", action="store_true", help="each node in its own OS process")
    parser.add_argument("--discovery", choices=("on", "off", "both"), default="on",
                        help="peer discovery (/sapo/peers/1) on, off, or one run of each, compared")
    parser.add_argument("--discover-peers", type=int, default=4,
                        help="with discovery on: dial until this many peers are connected (the node's default)")
    parser.add_argument("--smoke", action="store_true", help="3 nodes for 5 s: a quick check that this runs")
    # internal: the child side of --processes
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-dir", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.seconds, args.settle_seconds, args.drain_seconds = 3, 5.0, 2.0, 3.0
    if args.nodes < 2:
        parser.error(f"--nodes must be >= 2 (someone has to receive), got {args.nodes}")
    if args.seconds <= 0 or args.round_seconds <= 0 or args.groups_per_round < 1:
        parser.error("--seconds and --round-seconds must be > 0 and --groups-per-round >= 1")
    return args


# --- realistic groups ----------------------------------------------------------------------------

_OPENERS = [
    "Let me work through this step by step.",
    "First, I need to understand what the question is asking.",
    "Okay, so the problem gives us an expression to evaluate.",
    "We start by looking at each term carefully.",
]
_STEPS = [
    "The first number is {a} and the second number is {b}, so combining them gives {c}.",
    "If I add {a} and {b}, I get {c}, but I should double-check the sign of each term.",
    "Subtracting {b} from {a} leaves {c}; let me verify that by counting up from {b}.",
    "Another way to see it: {a} plus {b} is the same as {b} plus {a}, which is {c}.",
    "Wait, I made a mistake earlier, so let me redo the calculation with {a} and {b}.",
    "Checking again, {a} and {b} together make {c}, which matches what I found before.",
    "Since the operation is applied from left to right, the intermediate result is {c}.",
    "Hmm, the order matters here, because {a} minus {b} is not the same as {b} minus {a}.",
    "Breaking {a} into tens and ones makes it easier to combine with {b}, giving {c}.",
    "So far the running total is {c}, and there are no more terms to process.",
]


# Free-form clauses between the templated steps: without them the text is far more
# repetitive than a model's, and zlib would shrink it 4x instead of the 2-2.5x of real prose.
_WORDS = (
    "the a this that we it so then now here because since which when if and but or not also only "
    "first next last again still just really maybe perhaps clearly actually probably exactly "
    "number numbers sum difference result total value digit digits term terms sign answer step "
    "steps problem question expression equation operation order carry borrow tens ones place "
    "add adding subtract subtracting combine check verify compute calculate count write look think "
    "means gives leaves makes equals becomes stays matches remains keeps shows tells seems "
    "positive negative larger smaller bigger same different correct wrong careful simple easy "
    "left right side part whole half mistake error reason way method approach idea point case"
).split()


def _clause(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 12))]
    return " ".join(words).capitalize() + rng.choice((".", ",", ";", "?", "!"))


def reasoning_text(rng: random.Random, answer: str, chars: int = COMPLETION_CHARS) -> str:
    """About `chars` characters of plausible step-by-step text ending in an answer tag."""
    parts = [rng.choice(_OPENERS)]
    while sum(len(p) + 1 for p in parts) < chars - 40:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        parts.append(rng.choice(_STEPS).format(a=a, b=b, c=a + rng.choice((b, -b))))
        parts.append(_clause(rng))
    final = answer if rng.random() < 0.5 else str(rng.randint(-20, 20))  # half right, like a learning model
    return " ".join(parts) + f" Therefore the answer is <answer>{final}</answer>"


def build_groups(node_index: int, seed: int, completions: int = COMPLETIONS_PER_GROUP, chars: int = COMPLETION_CHARS):
    """A pool of real QuestionGroups for one node: real problems, scored by the real verifier."""
    from sapo.training.rewards import score_group
    from sapo.training.rollouts import QuestionGroup
    from sapo.training.tasks import TaskSampler, default_task_specs

    rng = random.Random(seed * 1_000 + node_index)
    sampler = TaskSampler(default_task_specs(["basic_arithmetic"]), dataset_seed=seed * 1_000 + node_index, rng_seed=0)
    groups = []
    for problem in sampler.sample(GROUPS_PER_NODE_POOL):
        texts = [reasoning_text(rng, problem.answer, chars) for _ in range(completions)]
        groups.append(QuestionGroup(problem=problem, completions=texts, rewards=score_group(problem, texts)))
    return groups


# --- the swarm -----------------------------------------------------------------------------------


@dataclass
class Totals:
    sent_at: dict[bytes, float] = field(default_factory=dict)  # frame -> time.time() before publish
    published: int = 0
    publish_failed: int = 0
    delivered: int = 0
    decode_rejected: int = 0
    latencies: list[float] = field(default_factory=list)
    frame_bytes: list[int] = field(default_factory=list)
    text_bytes: list[int] = field(default_factory=list)
    last_delivery: float = 0.0


@dataclass
class BenchNode:
    index: int
    peer_id: str
    service: object
    groups: list
    incoming: object
    rg_version: str

    def frame(self, group, round_index: int) -> bytes:
        # What node.exchange.GroupEncoder.frame does. Importing it would pull in node.core and
        # with it torch and transformers (about 9 s here) for two lines.
        from sapo.protocol.codec import encode
        from sapo.protocol.messages import to_wire

        message = to_wire(
            group,
            sender=self.peer_id,
            swarm=SWARM,
            sender_round=round_index,
            model_id="bench",
            created_at=time.time(),
            reasoning_gym_version=self.rg_version,
        )
        return encode(message)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def receive(node: BenchNode, totals: Totals, limits) -> None:
    from sapo.protocol.codec import Rejected, decode

    async for message in node.incoming:
        sent = totals.sent_at.get(message.data)
        try:
            decode(message.data, limits)
        except Rejected:
            totals.decode_rejected += 1
            continue
        totals.delivered += 1
        totals.last_delivery = time.monotonic()
        if sent is not None:
            totals.latencies.append(message.received_at - sent)


async def publish_rounds(node: BenchNode, args: argparse.Namespace, totals: Totals, stop_at: float) -> None:
    # Nodes are not in lock step: each starts at its own phase within the round.
    await trio.sleep(args.round_seconds * node.index / args.nodes)
    round_index = 0
    while time.monotonic() < stop_at:
        round_started = time.monotonic()
        for k in range(args.groups_per_round):
            group = node.groups[(round_index * args.groups_per_round + k) % len(node.groups)]
            frame = node.frame(group, round_index)
            totals.frame_bytes.append(len(frame))
            totals.text_bytes.append(sum(len(c.encode()) for c in group.completions))
            totals.sent_at[frame] = time.time()
            if await node.service.publish(frame):
                totals.published += 1
            else:
                totals.publish_failed += 1
                del totals.sent_at[frame]
        round_index += 1
        next_round = min(round_started + args.round_seconds, stop_at)
        await trio.sleep(max(0.0, next_round - time.monotonic()))


def gossip_settings(args: argparse.Namespace, peers: list[str], discover: bool):
    from sapo.protocol.settings import NetworkSettings

    return NetworkSettings(listen="/ip4/127.0.0.1/tcp/0", peers=peers, swarm=SWARM,
                          discover_peers=args.discover_peers if discover else 0)


async def run_swarm(args: argparse.Namespace, discover: bool) -> dict:
    from sapo.protocol.codec import DecodeLimits
    from sapo.protocol.gossip import GossipService
    from sapo.protocol.identity import load_or_create_identity, peer_id_of
    from sapo.training.tasks import reasoning_gym_version

    limits = DecodeLimits()
    totals = Totals()
    phases: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sapo-bench-gossip-") as tmp:
        started = time.monotonic()
        nodes: list[BenchNode] = []
        for i in range(args.nodes):
            key_pair = load_or_create_identity(Path(tmp) / f"node-{i}")
            send, recv = trio.open_memory_channel(1024)
            nodes.append(
                BenchNode(
                    index=i,
                    peer_id=peer_id_of(key_pair),
                    service=(key_pair, send),  # replaced by the service once the bootstrap address is known
                    groups=build_groups(i, args.seed),
                    incoming=recv,
                    rg_version=reasoning_gym_version(),
                )
            )
        phases["build groups s"] = time.monotonic() - started

        async with trio.open_nursery() as nursery:
            started = time.monotonic()
            for node in nodes:
                key_pair, send = node.service
                if node.index == 0:
                    peers = []
                else:
                    target = nodes[0] if args.topology == "star" else nodes[node.index - 1]
                    peers = [target.service.listen_addrs[0]]
                node.service = GossipService(gossip_settings(args, peers, discover), key_pair, send)
                with trio.fail_after(15):
                    await nursery.start(node.service.run)
                nursery.start_soon(receive, node, totals, limits)
            with trio.fail_after(30):
                while not all(node.service.connected_peers() for node in nodes):
                    await trio.sleep(0.05)
            phases["connect s"] = time.monotonic() - started
            print(f"{args.nodes} nodes connected in {phases['connect s']:.1f} s; publishing for {args.seconds:g} s",
                  file=sys.stderr, flush=True)
            await trio.sleep(args.settle_seconds)  # a few heartbeats: the mesh forms

            cpu0, wall0 = time.process_time(), time.monotonic()
            stop_at = wall0 + args.seconds
            async with trio.open_nursery() as publishers:
                for node in nodes:
                    publishers.start_soon(publish_rounds, node, args, totals, stop_at)
            expected = totals.published * (args.nodes - 1)
            drain_deadline = time.monotonic() + args.drain_seconds
            while totals.delivered < expected and time.monotonic() < drain_deadline:
                await trio.sleep(0.05)
            cpu = time.process_time() - cpu0
            wall = time.monotonic() - wall0
            counters = {}
            for node in nodes:
                for name, value in node.service.counters.items():
                    counters[name] = counters.get(name, 0) + value
            links = [len(node.service.connected_peers()) for node in nodes]
            shutdown_started = time.monotonic()
            nursery.cancel_scope.cancel()
        phases["shutdown s"] = time.monotonic() - shutdown_started
    return {
        "totals": totals,
        "expected": expected,
        "cpu_s": cpu,
        "wall_s": wall,
        "counters": counters,
        "phases": phases,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "links": links,
        "discover": discover,
    }


# --- one node per OS process ---------------------------------------------------------------------

# A child imports libp2p (~2.5 s of CPU); 32 of them on 2 cores that other jobs keep busy take minutes.
CHILD_START_SECONDS_PER_NODE = 20.0


def child_main(args: argparse.Namespace) -> int:
    """One node of a --processes swarm: prints `listening <addr>`, then `ready` once connected,
    waits for `go <unix time>` on stdin, publishes, drains and writes its record as JSON."""
    trio.run(_child, args)
    return 0


async def _child(args: argparse.Namespace) -> None:
    from sapo.protocol.codec import DecodeLimits, Rejected, decode
    from sapo.protocol.gossip import GossipService
    from sapo.protocol.identity import load_or_create_identity, peer_id_of
    from sapo.training.rollouts import QuestionGroup
    from sapo.training.tasks import reasoning_gym_version

    index, out_dir = args.child, args.child_dir
    key_pair = load_or_create_identity(out_dir / f"node-{index}")
    send, incoming = trio.open_memory_channel(4096)
    peers = [args.bootstrap] if args.bootstrap else []
    service = GossipService(gossip_settings(args, peers, args.discover_peers > 0), key_pair, send)
    # The parent built every node's groups: importing reasoning-gym here would double a child's start.
    groups = [QuestionGroup.model_validate(g) for g in json.loads((out_dir / f"groups-{index}.json").read_text())]
    node = BenchNode(index=index, peer_id=peer_id_of(key_pair), service=service, groups=groups,
                     incoming=incoming, rg_version=reasoning_gym_version())
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
        await nursery.start(service.run)
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


def run_processes(args: argparse.Namespace, discover: bool) -> dict:
    """N child processes in a star (or chain) on 127.0.0.1; their records are merged here."""
    phases: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sapo-bench-gossip-") as tmp:
        common = [sys.executable, str(Path(__file__).resolve()), "--child-dir", tmp, "--nodes", str(args.nodes),
                  "--seconds", str(args.seconds), "--groups-per-round", str(args.groups_per_round),
                  "--round-seconds", str(args.round_seconds), "--drain-seconds", str(args.drain_seconds),
                  "--seed", str(args.seed), "--discover-peers", str(args.discover_peers if discover else 0)]
        started = time.monotonic()
        for i in range(args.nodes):
            pool = [group.model_dump(mode="json") for group in build_groups(i, args.seed)]
            (Path(tmp) / f"groups-{i}.json").write_text(json.dumps(pool))
        phases["build groups s"] = time.monotonic() - started
        children: list[subprocess.Popen] = []
        readers: list[LineReader] = []
        logs = [open(Path(tmp) / f"node-{i}.log", "w") for i in range(args.nodes)]
        try:
            started = time.monotonic()
            deadline = started + 60 + CHILD_START_SECONDS_PER_NODE * args.nodes
            addresses: list[str] = []

            def start(i: int) -> LineReader:
                bootstrap = [] if i == 0 else ["--bootstrap", addresses[0 if args.topology == "star" else i - 1]]
                proc = subprocess.Popen([*common, "--child", str(i), *bootstrap], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=logs[i], bufsize=0)
                children.append(proc)
                readers.append(LineReader(proc))
                return readers[-1]

            # A star's leaves need only the hub's address: start them all at once. A chain goes one by one.
            addresses.append(start(0).line(deadline, "node 0 to listen").split()[1])
            if args.topology == "star":
                for i in range(1, args.nodes):
                    start(i)
                addresses += [reader.line(deadline, f"node {i} to listen").split()[1]
                              for i, reader in enumerate(readers[1:], 1)]
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
            phases["start+connect s"] = time.monotonic() - started
            print(f"{args.nodes} node processes connected in {phases['start+connect s']:.1f} s; publishing for "
                  f"{args.seconds:g} s after {args.settle_seconds:g} s to settle", file=sys.stderr, flush=True)
            go = time.time() + args.settle_seconds
            for proc in children:
                proc.stdin.write(f"go {go}\n".encode())
                proc.stdin.flush()
            for i, proc in enumerate(children):
                code = proc.wait(timeout=args.settle_seconds + args.seconds + args.drain_seconds + 60)
                if code != 0:
                    raise RuntimeError(f"node {i} exited with {code}: {Path(logs[i].name).read_text()[-2000:]}")
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


def print_report(args: argparse.Namespace, result: dict) -> None:
    t: Totals = result["totals"]
    expected = result["expected"]
    messages = t.delivered + t.published
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print()
    where = f"{args.nodes} OS processes" if args.processes else "ONE trio process"
    print(
        f"gossip benchmark: {args.nodes} nodes ({args.topology}, discovery {'on' if result['discover'] else 'off'}) "
        f"in {where} on 127.0.0.1, real GossipService (noise, yamux, gossipsub 1.1), {args.seconds:g} s of "
        f"publishing, {args.groups_per_round} groups / node / {args.round_seconds:g} s"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"load average {load:.2f} at the end. Numbers are CONTENDED when other jobs share the CPUs."
    )
    rows = [
        ("published groups", f"{t.published} (+{t.publish_failed} refused by publish)"),
        ("delivered / expected", f"{t.delivered} / {expected} = {t.delivered / expected if expected else 0:.4f}"),
        ("latency p50 / p99 / max", "{:.1f} / {:.1f} / {:.1f} ms".format(
            *(1e3 * percentile(t.latencies, q) for q in (50, 99, 100)))),
        ("frame bytes per group (wire)", f"{mean(t.frame_bytes):,.0f} (min {min(t.frame_bytes, default=0):,}, "
                                         f"max {max(t.frame_bytes, default=0):,})"),
        ("completion text bytes per group", f"{mean(t.text_bytes):,.0f} ({COMPLETIONS_PER_GROUP} x ~{COMPLETION_CHARS} chars)"),
        ("wire / text", f"{mean(t.frame_bytes) / mean(t.text_bytes):.3f}" if t.text_bytes else "n/a"),
        ("process CPU" + (" (all nodes)" if args.processes else ""),
         f"{result['cpu_s']:.1f} s over {result['wall_s']:.1f} s wall "
         f"({100 * result['cpu_s'] / result['wall_s']:.0f}% of one core)"),
        ("CPU per message", f"{1e3 * result['cpu_s'] / messages:.2f} ms "
                            f"(process CPU / (delivered + published) = {messages} messages)" if messages else "n/a"),
        ("decode rejected", str(t.decode_rejected)),
        ("gossip counters (sum over nodes)", ", ".join(f"{k}={v}" for k, v in sorted(result["counters"].items()))),
        ("connections per node at the end", _links(result["links"])),
        ("setup", ", ".join(f"{k} {v:.1f}" for k, v in result["phases"].items())),
        ("peak RSS (sum over processes)" if args.processes else "peak RSS (whole process)",
         f"{result['max_rss_mb']:.0f} MB"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


def _links(links: list[int]) -> str:
    if not links:
        return "n/a"
    return f"mean {sum(links) / len(links):.1f}, min {min(links)}, max {max(links)}"


def print_comparison(args: argparse.Namespace, results: list[dict]) -> None:
    print()
    print(f"discovery off vs on, {args.nodes} nodes ({args.topology}, "
          f"{'one process per node' if args.processes else 'one process'}):")
    print("discovery  delivered / expected      ratio   p50 ms   p99 ms   links per node (mean, min)")
    for result in results:
        t, expected = result["totals"], result["expected"]
        p50, p99 = (1e3 * percentile(t.latencies, q) for q in (50, 99))
        links = result["links"]
        print(f"{'on' if result['discover'] else 'off':<9}  {f'{t.delivered} / {expected}':<22}  "
              f"{t.delivered / expected if expected else 0:.4f}  {p50:7.1f}  {p99:7.1f}   "
              f"{sum(links) / len(links):.1f}, {min(links)}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child_main(args)
    runs = {"on": [True], "off": [False], "both": [False, True]}[args.discovery]
    results = []
    for discover in runs:
        if args.processes:
            try:
                result = run_processes(args, discover)
            except (TimeoutError, RuntimeError, subprocess.TimeoutExpired) as error:
                print(f"gossip benchmark failed: {error}", file=sys.stderr)
                return 1
        else:
            budget = 60 + args.settle_seconds + args.seconds + args.drain_seconds + 2 * args.nodes
            try:
                result = trio.run(_bounded, run_swarm, args, discover, budget)
            except trio.TooSlowError:
                print(f"gossip benchmark did not finish within {budget:.0f} s", file=sys.stderr)
                return 1
        print_report(args, result)
        results.append(result)
    if len(results) > 1:
        print_comparison(args, results)
    return 0


async def _bounded(fn, args, discover: bool, seconds: float):
    with trio.fail_after(seconds):
        return await fn(args, discover)


if __name__ == "__main__":
    sys.exit(main())
