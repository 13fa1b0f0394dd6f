"""Gossip N nodes' rollout groups over the real GossipService on 127.0.0.1.

All N nodes run in this one trio process (one libp2p host each, its own Ed25519 identity from
`protocol.identity` in a temp dir), so every number here is N nodes sharing one Python
interpreter: latency includes waiting for the other nodes' work, and the CPU figure is the
whole swarm's. Nodes connect in a star (every node dials node 0, the bootstrap peer) or a
chain (node i dials node i-1).

Every node publishes `--groups-per-round` real RolloutGroup frames (`to_wire` + `encode`, as
`node.exchange.GroupEncoder.frame` does) every `--round-seconds`, each node at its own phase in the
round. A group is one easy basic_arithmetic question with 8 completions of about 1,000
characters of reasoning-like text ending in <answer>N</answer>. Receivers decode every frame
with the real codec (bounded, validated), as a node's intake does before its checks.

    .venv/bin/python bench/gossip.py                 # 8 nodes, 30 s
    .venv/bin/python bench/gossip.py --nodes 3 --topology chain
    .venv/bin/python bench/gossip.py --smoke         # 3 nodes, 5 s

Latency is from just before `publish()` to the receiving node's `received_at` (same clock,
same process). Delivery ratio = delivered / (published x (N - 1)); after the last publish the
nodes get `--drain-seconds` to finish delivering.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

SWARM = "bench"
TOPIC = "sapo/bench/rollouts/1"
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
    parser.add_argument("--smoke", action="store_true", help="3 nodes for 5 s: a quick check that this runs")
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


def build_groups(node_index: int, seed: int):
    """A pool of real QuestionGroups for one node: real problems, scored by the real verifier."""
    from sapo.training.rewards import score_group
    from sapo.training.rollouts import QuestionGroup
    from sapo.training.tasks import TaskSampler, default_task_specs

    rng = random.Random(seed * 1_000 + node_index)
    sampler = TaskSampler(default_task_specs(["basic_arithmetic"]), dataset_seed=seed * 1_000 + node_index, rng_seed=0)
    groups = []
    for problem in sampler.sample(GROUPS_PER_NODE_POOL):
        texts = [reasoning_text(rng, problem.answer) for _ in range(COMPLETIONS_PER_GROUP)]
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


async def run_swarm(args: argparse.Namespace) -> dict:
    from sapo.protocol.codec import DecodeLimits
    from sapo.protocol.gossip import GossipService, GossipSettings
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
                settings = GossipSettings(listen="/ip4/127.0.0.1/tcp/0", peers=peers, topic=TOPIC)
                node.service = GossipService(settings, key_pair, send)
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
    }


def print_report(args: argparse.Namespace, result: dict) -> None:
    t: Totals = result["totals"]
    expected = result["expected"]
    messages = t.delivered + t.published
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print()
    print(
        f"gossip benchmark: {args.nodes} nodes ({args.topology}) in ONE trio process on 127.0.0.1, "
        f"real GossipService (noise, yamux, gossipsub 1.1), {args.seconds:g} s of publishing, "
        f"{args.groups_per_round} groups / node / {args.round_seconds:g} s"
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
        ("process CPU", f"{result['cpu_s']:.1f} s over {result['wall_s']:.1f} s wall "
                        f"({100 * result['cpu_s'] / result['wall_s']:.0f}% of one core)"),
        ("CPU per message", f"{1e3 * result['cpu_s'] / messages:.2f} ms "
                            f"(process CPU / (delivered + published) = {messages} messages)" if messages else "n/a"),
        ("decode rejected", str(t.decode_rejected)),
        ("gossip counters (sum over nodes)", ", ".join(f"{k}={v}" for k, v in sorted(result["counters"].items()))),
        ("setup", ", ".join(f"{k} {v:.1f}" for k, v in result["phases"].items())),
        ("peak RSS (whole process)", f"{result['max_rss_mb']:.0f} MB"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    budget = 60 + args.settle_seconds + args.seconds + args.drain_seconds + 2 * args.nodes
    try:
        result = trio.run(_bounded, run_swarm, args, budget)
    except trio.TooSlowError:
        print(f"gossip benchmark did not finish within {budget:.0f} s", file=sys.stderr)
        return 1
    print_report(args, result)
    return 0


async def _bounded(fn, args, seconds: float):
    with trio.fail_after(seconds):
        return await fn(args)


if __name__ == "__main__":
    sys.exit(main())
