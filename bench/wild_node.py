"""One process of bench/wild.py: the node lives its plan gives this process, each a real node's
network and exchange, run in this process's network namespace (`ip netns exec`).

A node life is what the daemon runs around the model (node/daemon/run.py): `serve_network`, the
exchange with the node's own memory (its inbox and the real intake checks, node/core/intake.py,
in a worker thread), `fetch_until_training` while its model "loads" (`load_s`), then rounds at
its own pace. A round takes up to J groups from the inbox (what the node would train on), then
shares two fresh groups of its own (real basic_arithmetic problems, 8 completions; flat ones, all
completions with the same wrong answer, at the plan's share) and wants `groups_wanted(J)`.

Each round appends, cumulatively: the time, the groups the intake accepted, the fresh groups the
inbox held, those taken, the node's links, its CPU and its bytes in and out (bench/wild_link.py).
At the end of its life a node writes one JSON row; the process writes one row of its own.

    ip netns exec NS python -m bench.wild_node PLAN.json PROCESS
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

from bench.wild_link import LINK, NODE, CpuSampler, NodeMeter, install, meter_for, timed_in_thread
from bench.wild_standing import Tally, snapshot

COMPLETIONS = 8
# A pusher drops a link this old to a peer it cannot push to (`redial_deaf`).
DEAF_AFTER_S = 30.0


def make_groups(sampler, rng: random.Random, count: int, flat_share: float) -> tuple[list, int]:
    """`count` fresh QuestionGroups scored by the real verifier, each flat (every completion ends in
    the same wrong answer: the intake refuses it as no_signal) with chance `flat_share`; and how
    many are flat."""
    from bench.gossip_groups import reasoning_text
    from sapo.training.problems.rewards import score_group
    from sapo.training.problems.rollouts import QuestionGroup

    groups, flat = [], 0
    for problem in sampler.sample(count):
        is_flat = rng.random() < flat_share
        while True:
            texts = [reasoning_text(rng, problem.answer) for _ in range(COMPLETIONS)]
            if is_flat:
                wrong = f"{problem.answer}0"
                texts = [t[: t.rindex("<answer>")] + f"<answer>{wrong}</answer>" for t in texts]
            rewards = score_group(problem, texts)
            if is_flat or max(rewards) != min(rewards):
                break
        groups.append(QuestionGroup(problem=problem, completions=texts, rewards=rewards))
        flat += is_flat
    return groups, flat


class Life:
    """One node from its join to its leave: its meter, its round records and what it counted."""

    def __init__(self, spec: dict, plan: dict):
        self.spec, self.plan = spec, plan
        self.meter: NodeMeter = meter_for(spec["ip"])
        self.rounds: list[list] = []
        self.joined_s: float | None = None
        self.first_accepted_s: float | None = None
        self.flat_shared = 0
        self.shared = 0
        self.pushed = 0  # --standing's pushers: groups put on the topic
        self.peer_id = ""
        self.counters = None
        self.net_counters: dict = {}
        self.memory: Any = None  # the node's NodeMemory, once it runs
        self.net: Any = None  # its Network, once it runs
        self.tally: Tally | None = None  # with --standing: what reached its intake, per kind of author
        self.standing: dict | None = None  # with --standing: its snapshot at the end
        self.standing_over_time: list[dict] = []  # ...and its shares every `snapshot_s` before

    def now_s(self) -> float:
        return round(time.time() - self.plan["t0"], 3)

    def weigh(self) -> dict:
        """--standing: the honest share of this node's weight now (bench/wild_standing.py)."""
        inbox = self.memory.inbox
        return snapshot(inbox.standing, inbox.peers(), self.plan["standing"]["roles"], self.peer_id)

    def row(self) -> dict:
        c = self.counters
        return {
            "kind": "node",
            "run": self.plan["run"],
            **{k: self.spec[k] for k in ("id", "process", "ip", "seed", "newcomer", "round_s", "start_s", "stop_s")},
            "role": self.spec.get("role", "honest"),
            "peer_id": self.peer_id,
            "joined_s": self.joined_s,
            "first_accepted_s": self.first_accepted_s,
            "shared": self.shared,
            "flat_shared": self.flat_shared,
            "pushed": self.pushed,
            # [t, accepted so far, fresh groups in the inbox, taken, links, cpu s, bytes in, bytes out]
            "rounds": self.rounds,
            "intake": None
            if c is None
            else {"received": c.received, "accepted": c.accepted, "rejected": dict(c.rejected)},
            "network": {
                k: v
                for k, v in self.net_counters.items()
                if self.tally is not None or k.startswith(("fetch", "discovery", "serve", "links"))
            },
            "meter": self.meter.snapshot(),
            **(
                {}
                if self.tally is None
                else {
                    "by_author_kind": self.tally.to_json(),
                    "standing": self.standing,
                    "standing_over_time": self.standing_over_time,
                }
            ),
        }


def node_settings(spec: dict, plan: dict):
    from sapo.node.core.settings import NodeSettings
    from sapo.protocol.settings import NetworkSettings
    from sapo.sampling.trust import TrustSettings

    seeds = [address for address in plan["seeds"] if f"/ip4/{spec['ip']}/" not in address]
    network = NetworkSettings(
        listen=f"/ip4/{spec['ip']}/tcp/{plan['port']}",
        peers=seeds,
        swarm=plan["swarm"],
        discover_peers=plan["discover_peers"],
        # older rows' plans had no connection manager to set
        connections_low=plan.get("connections_low", 64),
        connections_high=plan.get("connections_high", 96),
        exchange="fetch",
    )
    ramp = plan.get("ramp_s")  # None: the node's own
    return NodeSettings(
        network=network, trust=TrustSettings() if ramp is None else TrustSettings(standing_ramp_seconds=ramp)
    )


async def live(spec: dict, plan: dict, lives: list[Life]) -> None:
    """Run one node from `start_s` to `stop_s` (None: the end of the run) of the plan's clock;
    with --standing, then weigh its authors (bench/wild_standing.py)."""
    from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of

    life = Life(spec, plan)
    if plan.get("standing"):
        life.tally = Tally(plan["standing"]["roles"])
    lives.append(life)
    NODE.set(life.meter)  # this task's context, and so every task and thread it starts
    key_pair = load_or_create_identity(Path(spec["key"]))
    life.peer_id = peer_id_of(key_pair)
    await trio.sleep_until(clock_at(plan, spec["start_s"]))
    stop = plan["end_s"] if spec["stop_s"] is None else spec["stop_s"]
    with trio.move_on_at(clock_at(plan, stop)):
        async with trio.open_nursery() as nursery:
            await run_node(nursery, life, key_pair)
    if life.tally is not None and life.memory is not None:
        life.standing = life.weigh()


async def run_node(nursery: trio.Nursery, life: Life, key_pair) -> None:
    from sapo.node.core.counters import NodeCounters
    from sapo.node.core.exchange import GossipExchange, group_encoder
    from sapo.node.core.intake import node_intake
    from sapo.node.core.memory import NodeMemory
    from sapo.node.core.node import node_inbox
    from sapo.node.daemon.run import INCOMING_PLACES, fetch_until_training
    from sapo.protocol.exchange.arrival_queues import ArrivalQueues
    from sapo.protocol.network import serve_network
    from sapo.training.problems.rewards import verifier_for
    from sapo.training.problems.tasks import reasoning_gym_version

    spec, plan = life.spec, life.plan
    settings = node_settings(spec, plan)
    life.joined_s = life.now_s()
    arrivals = ArrivalQueues(INCOMING_PLACES[settings.network.exchange])
    net = await nursery.start(partial(serve_network, settings.network, key_pair, arrivals))
    life.net_counters, life.net = net.counters, net
    counters = life.counters = NodeCounters()
    intake = node_intake(
        settings,
        counters,
        peer_id=life.peer_id,
        rg_version=reasoning_gym_version(),
        verifier=verifier_for(settings.training.reward),
    )
    memory = life.memory = NodeMemory(node_inbox(settings), intake, counters)
    if life.tally is not None:
        intake.accept = life.tally.wrap_accept(intake.accept)
    # the intake's checks and the inbox's writes run in worker threads: their CPU is this node's
    intake.accept = timed_in_thread(life.meter, intake.accept)
    store = timed_in_thread(life.meter, memory.store)

    def stored(group, now, provenance, *args, **kwargs):
        if life.first_accepted_s is None:
            life.first_accepted_s = life.now_s()
        if life.tally is not None:
            life.tally.stored(group.origin, provenance)
        store(group, now, provenance, *args, **kwargs)

    memory.store = stored
    encoder = group_encoder(settings, life.peer_id, reasoning_gym_version(), model_id="bench")
    exchange = GossipExchange(net, encoder, memory, want=plan["want"])
    nursery.start_soon(exchange.receive, arrivals)
    if life.tally is not None:
        nursery.start_soon(watch_standing, life)
    loading = await nursery.start(fetch_until_training, net, plan["want"])
    await trio.sleep(plan["load_s"] + (0 if spec["newcomer"] else spec["phase"] * spec["round_s"]))
    loading.cancel()
    await rounds(life, net, memory, exchange)


async def watch_standing(life: Life) -> None:
    """--standing: the honest share of this node's weight every `snapshot_s`, how it got there."""
    while True:
        await trio.sleep(life.plan["standing"]["snapshot_s"])
        shares = life.weigh()
        life.standing_over_time.append(
            {
                "t": life.now_s(),
                "table": shares["table"],
                "inbox": shares["inbox"],
                "pushers": pushers_seen(life.net, life.plan["standing"]["roles"]),
            }
        )


def pushers_seen(net, roles: dict[str, str]) -> list[int]:
    """The pushers this node is connected to now, those it takes for older releases (their groups
    on the topic come by right), and those its own groups go to (established older releases)."""
    from libp2p.peer.id import ID

    connected = [peer for peer in net.connected_peers() if roles.get(peer) == "pusher"]
    older = [peer for peer in connected if net.older.is_older(ID.from_base58(peer))]
    readers = [peer for peer in net.legacy_peers() if roles.get(peer) == "pusher"]
    return [len(connected), len(older), len(readers)]


async def rounds(life: Life, net, memory, exchange) -> None:
    """The node's rounds at its own pace, until its life is cancelled."""
    from sapo.training.problems.tasks import TaskSampler, default_task_specs

    spec, plan = life.spec, life.plan
    index = int(spec["id"][1:])
    sampler = TaskSampler(
        default_task_specs(["basic_arithmetic"]), dataset_seed=plan["seed"] * 100_000 + index, rng_seed=0
    )
    rng = random.Random(plan["seed"] * 100_000 + index)
    j, next_round = plan["j"], trio.current_time()
    for r in range(1_000_000):
        await trio.sleep_until(next_round)
        now = time.time()
        fresh = memory.inbox.newest_first(now)
        memory.inbox.take(fresh[:j])  # what the round trains on
        m = life.meter
        life.rounds.append(
            [life.now_s(), memory.counters.accepted, len(fresh), min(j, len(fresh)), len(net.connected_peers()),
             round(m.cpu_s, 6), m.bytes_in, m.bytes_out, lasted_links(net.host, now)]
        )  # fmt: skip
        started = time.thread_time()
        groups, flat = make_groups(sampler, rng, plan["groups_per_round"], plan["flat_share"])
        m.build_cpu_s += time.thread_time() - started
        life.shared += len(groups)
        life.flat_shared += flat
        await exchange.publish(groups, r)
        next_round += spec["round_s"]


def lasted_links(host, now: float) -> int:
    """Peers whose every link has lasted the connection manager's grace: what it counts against
    its high watermark (young links are left out of the count so that a stranger remaking links
    cannot make it close the old ones; protocol/reach/connections.py)."""
    from sapo.protocol.reach.connections import past_grace
    from sapo.protocol.toolkit.hosts import open_peers

    lasted = 0
    for peer in open_peers(host):
        links = [c for c in host.get_network().get_connections(peer) if not c.is_closed]
        lasted += bool(links) and past_grace(links, now)
    return lasted


async def stranger(spec: dict, plan: dict, lives: list[Life]) -> None:
    """A gossip-only peer (identify lists the topic, not /sapo/groups/1) that keeps a link to
    every node and publishes nothing: what issue #41's downgrade needs of a stranger."""
    life = Life({**spec, "seed": False, "newcomer": False, "round_s": None, "stop_s": None}, plan)
    lives.append(life)
    await gossip_only(life, spec["peers"], push_s=None)


async def pusher(spec: dict, plan: dict, lives: list[Life]) -> None:
    """--standing's pusher: a gossip-only peer like the stranger, linked to every honest node,
    that puts one valid group of its own on the topic every `push_s` (bench/wild_standing.py)."""
    life = Life(spec, plan)
    lives.append(life)
    honest = [f"/ip4/{x['ip']}/tcp/{plan['port']}/p2p/{x['peer_id']}" for x in plan["lives"] if "role" not in x]
    await gossip_only(life, honest, push_s=plan["standing"]["push_s"])


async def gossip_only(life: Life, peers: list[str], push_s: float | None) -> None:
    """Pose as a release before 0.4.0 from `start_s` to the end of the run: serve gossip only,
    keep a link to each of `peers`, count what arrives in `shared`; every `push_s` (if given)
    publish a group of our own."""
    from sapo.protocol.network import serve_network
    from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of
    from sapo.protocol.settings import NetworkSettings
    from sapo.protocol.wire.group_wire import PROTOCOL_ID

    spec, plan = life.spec, life.plan
    NODE.set(life.meter)
    key_pair = load_or_create_identity(Path(spec["key"]))
    life.peer_id = peer_id_of(key_pair)
    await trio.sleep_until(clock_at(plan, spec["start_s"]))
    settings = NetworkSettings(
        listen=f"/ip4/{spec['ip']}/tcp/{plan['port']}", swarm=plan["swarm"], exchange="gossip", discover_peers=0
    )
    send, receive = trio.open_memory_channel(1024)
    with trio.move_on_at(clock_at(plan, plan["end_s"])):
        async with trio.open_nursery() as nursery:
            net = await nursery.start(partial(serve_network, settings, key_pair, send))
            net.host.remove_stream_handler(PROTOCOL_ID)  # before any link: identify never lists it
            life.joined_s = life.now_s()
            life.net_counters = net.counters
            for address in peers:
                nursery.start_soon(net.keeper.keep, address)
            if push_s is not None:
                nursery.start_soon(push, life, net, settings, push_s)
            async for _arrival in receive:
                life.shared += 1  # groups the nodes put on the topic for it (and each other)


async def push(life: Life, net, settings, every: float) -> None:
    """One fresh valid group (never flat) on the rollouts topic every `every` seconds, sent to every
    peer subscribed to the topic, not only to our mesh: the router's path for older releases
    (protocol/exchange/older_releases.py) with every subscriber a reader."""
    from sapo.node.core.exchange import group_encoder
    from sapo.node.core.settings import NodeSettings
    from sapo.training.problems.tasks import TaskSampler, default_task_specs, reasoning_gym_version

    net.pubsub.router.readers = lambda: list(net.pubsub.peers)
    index = int(life.spec["id"][1:])
    seed = life.plan["seed"] * 100_000 + index
    sampler = TaskSampler(default_task_specs(["basic_arithmetic"]), dataset_seed=seed, rng_seed=0)
    rng = random.Random(seed)
    encoder = group_encoder(NodeSettings(network=settings), life.peer_id, reasoning_gym_version(), model_id="bench")
    await trio.sleep(rng.random() * every)
    for r in range(1_000_000):
        groups, _ = make_groups(sampler, rng, 1, 0.0)
        dropped = await redial_deaf(net, settings.topic)
        life.rounds.append([life.now_s(), *push_reach(net, settings.topic), dropped])
        for frame in encoder.frames(groups, r).groups:
            life.pushed += bool(await net.publish(frame))
        await trio.sleep(every)


async def redial_deaf(net, topic: str) -> int:
    """Drop the links, older than DEAF_AFTER_S, to peers we cannot push to (no pubsub stream of
    ours, or no subscription of theirs heard): py-libp2p opens a peer's pubsub stream once, when
    the link comes, and on a loaded machine that open times out and is never tried again while
    the link lasts. The keeper dials each dropped peer again. How many were dropped."""
    from sapo.protocol.toolkit.hosts import connected_seconds, open_peers

    pubsub = net.pubsub
    subscribed = pubsub.peer_topics.get(topic, set())
    deaf = [
        peer
        for peer in open_peers(net.host)
        if not (peer in pubsub.peers and peer in subscribed) and connected_seconds(net.host, peer) >= DEAF_AFTER_S
    ]
    for peer in deaf:
        with trio.move_on_after(10):
            await net.host.disconnect(peer)
    return len(deaf)


def push_reach(net, topic: str) -> list[int]:
    """Before a push: the peers we are connected to, those our pubsub has a stream with, those
    of them subscribed to the topic, and those the router will send to (its queue not backed up)."""
    from sapo.protocol.exchange.older_releases import MAX_QUEUED
    from sapo.protocol.toolkit.hosts import open_peers

    pubsub = net.pubsub
    subscribed = pubsub.peer_topics.get(topic, set())
    streams = [peer for peer in pubsub.peers if peer in subscribed]
    sendable = [peer for peer in streams if len(pubsub.peer_queues.get(peer, ())) < MAX_QUEUED]
    return [len(open_peers(net.host)), len(pubsub.peers), len(streams), len(sendable)]


def clock_at(plan: dict, seconds: float) -> float:
    """The trio clock's reading at `seconds` of the plan's clock (wall time from t0)."""
    return trio.current_time() + (plan["t0"] + seconds - time.time())


async def run_process(plan: dict, process: int) -> list[dict]:
    install(plan["delay_s"])
    cpu = CpuSampler()
    lives: list[Life] = []
    cpu0, wall0, wait0 = time.process_time(), time.time(), cpu_wait_seconds()
    cpu.start()
    async with trio.open_nursery() as nursery:
        for spec in plan["lives"]:
            if spec["process"] == process:
                nursery.start_soon(pusher if spec.get("role") == "pusher" else live, spec, plan, lives)
        spec = plan.get("stranger")
        if spec and spec["process"] == process:
            nursery.start_soon(stranger, spec, plan, lives)
    cpu.stop()
    rows = [life.row() for life in lives]
    for row, life in zip(rows, lives):
        if life.spec.get("peers") is not None:
            row["kind"] = "stranger"
    rows.append(
        {
            "kind": "process",
            "run": plan["run"],
            "process": process,
            "pid": os.getpid(),
            "cpu_s": time.process_time() - cpu0,
            "waited_s": cpu_wait_seconds() - wait0,
            "wall_s": time.time() - wall0,
            "attributed_loop_s": cpu.attributed,
            "loop_process_s": cpu.process,  # the loop thread's CPU in trio's own work
            "samples": cpu.samples,
            "thread_s": sum(life.meter.thread_cpu_s for life in lives),
            "build_s": sum(life.meter.build_cpu_s for life in lives),
            "unowned_bytes": LINK.unowned_bytes,
            "unbound_dials": LINK.unbound_dials,
        }
    )
    return rows


def cpu_wait_seconds() -> float:
    """Seconds this process waited for a core (the kernel's schedstat), as bench/scale_swarm.py."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def preload() -> None:
    """Import what a node uses before the clock starts: an import inside a node's task would be
    charged to that node (transformers and torch come with node/core/node.py: about 10 s)."""
    import sapo.node.core.exchange  # noqa: F401
    import sapo.node.core.intake  # noqa: F401
    import sapo.node.core.node  # noqa: F401
    import sapo.node.daemon.run  # noqa: F401
    import sapo.protocol.network  # noqa: F401
    import sapo.training.problems.tasks  # noqa: F401


def load(argv: list[str]) -> tuple[dict, int]:
    """A node process's start (this one's and bench/capture_node.py's): its plan and its number
    from the command line, quiet logging, and the node's modules imported."""
    logging.basicConfig(level=logging.ERROR)
    preload()
    return json.loads(Path(argv[0]).read_text()), int(argv[1])


def write_rows(plan: dict, process: int, rows: list[dict]) -> None:
    with open(plan["rows"].format(process=process), "w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")


def main(argv: list[str]) -> int:
    plan, process = load(argv)
    import gc

    gc.freeze()  # start-up's objects (libraries) out of the collections, as bench/scale_swarm.py
    write_rows(plan, process, trio.run(run_process, plan, process))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
