"""The node daemon: one trio nursery holding the network service, the page, the receive
loop and the round loop, shut down by cancelling it on SIGINT/SIGTERM.

The libp2p host opens first and the dial address is printed before the model loads (a
SmolLM2 conversion or a warm start can take minutes), so peers can connect and the page can
show the loading progress meanwhile. Groups that arrive before the node can check them wait
in the bounded channel between the network and the intake; past it they are dropped and
counted (`inbox_channel_full`), never allowed to block the network.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from sapo.node.core.counters import NodeCounters
from sapo.node.core.exchange import GossipExchange, group_encoder, groups_wanted
from sapo.node.core.metrics import RoundRecord
from sapo.node.core.node import Node
from sapo.node.core.round import Exchange, run_round
from sapo.node.core.settings import NodeSettings
from sapo.node.core.state import NodeState
from sapo.node.daemon.dialable import dialable_all, page_urls
from sapo.node.daemon.live import LiveStatus, LoadedNode, LoadingStopped
from sapo.node.daemon.prometheus import NodeMetrics
from sapo.node.daemon.status import NodeStatus, write_status_file
from sapo.node.daemon.web import serve_page
from sapo.node.judge.client import JudgeClient
from sapo.protocol.exchange.arrival_queues import ArrivalQueues
from sapo.protocol.exchange.arrivals import Route
from sapo.protocol.network import Network, serve_network
from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of
from sapo.protocol.settings import logprobs_topic
from sapo.training.completions.generation import GenerationInterrupted
from sapo.training.learning.warmstart import watching_warm_start
from sapo.training.models.devices import resolve_device
from sapo.training.problems.tasks import reasoning_gym_version

log = logging.getLogger("sapo.node")

# Arrivals wait here between the network and the intake checks (and, while the model loads,
# until the intake exists), each route in its own places (protocol/exchange/arrival_queues.py);
# beyond them the network drops and counts rather than block on a slow node. In fetch mode the
# topic brings only older releases' groups and log-probs, all unasked: they cannot take the
# places of the groups the node asked for.
INCOMING_PLACES: dict[str, dict[Route, int]] = {
    "fetch": {"fetch": 192, "gossip": 64},
    "gossip": {"fetch": 0, "gossip": 256},
}

# How often a node that a swarm started checks that the swarm is still there.
ORPHAN_CHECK_SECONDS = 1.0
# How often a node asks for groups before its rounds do (fetch_until_training). Each author is
# asked at most once a second and answers only with groups newer than the last it gave us (a
# request it has nothing for waits for its next one), so this piles nothing up; and a peer that
# finishes while we load is not missed.
FETCH_WHILE_LOADING_SECONDS = 1.0

# What each signal means to the person who sent it.
SIGNAL_MEANING = {
    signal.SIGINT: "Ctrl-C",
    signal.SIGTERM: "a stop request: the swarm's Ctrl-C, docker stop or systemd",
}


async def round_loop(
    node: Node,
    state: NodeState,
    exchange: Exchange,
    torch_lock: trio.Lock,
    metrics: NodeMetrics | None = None,
    after_round: Callable[[NodeState, RoundRecord], None] | None = None,
) -> NodeState:
    """Run rounds until --rounds, from `state`; returns the state after the last round done.
    `after_round` (the page, the judge client) sees each one and must not block."""
    rounds = node.settings.run.rounds
    if rounds and state.round >= rounds:
        log.info("already at round %d of %d; nothing to do", state.round, rounds)
        return state
    while not rounds or state.round < rounds:
        try:
            result = await run_round(node, state, exchange, torch_lock)
        except GenerationInterrupted:
            return state  # shutting down; this round never happened
        state = result.state
        log.info(result.record.log_line())
        if metrics is not None:
            metrics.observe(result.record)
        if after_round is not None:
            after_round(state, result.record)
    return state


def _finish(scope: trio.CancelScope, stop: threading.Event) -> None:
    # A worker thread cannot be cancelled from trio: ask the warm start and the generation
    # loop to stop at their next step. An update in progress finishes, so the weights always
    # match a whole round. The page reads "stopping" from `stop`.
    stop.set()
    scope.cancel()


async def _cancel_on_signal(
    scope: trio.CancelScope, stop: threading.Event, *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            log.info(
                "received %s (%s); finishing cleanly",
                signal.Signals(signum).name,
                SIGNAL_MEANING[signal.Signals(signum)],
            )
            _finish(scope, stop)
            return


async def _cancel_when_orphaned(parent: int, scope: trio.CancelScope, stop: threading.Event) -> None:
    """A node its swarm started stops as on SIGTERM once the swarm is gone, however it went: a
    SIGKILLed swarm can forward nothing, and its nodes would train on, orphaned, for good."""
    while os.getppid() == parent:  # noqa: ASYNC110 - no event says a parent went: poll
        await trio.sleep(ORPHAN_CHECK_SECONDS)
    log.info("its swarm (pid %d) is gone; finishing cleanly", parent)
    _finish(scope, stop)


async def start_network(
    nursery: trio.Nursery, settings: NodeSettings, key_pair, counters: dict[str, int], stop: threading.Event
) -> tuple[Network, ArrivalQueues, LiveStatus]:
    """Open the network (protocol/network.py) as a task of the daemon's nursery and print the
    addresses peers can dial. What it receives waits in the returned channel until the node
    can check it (start_intake). The daemon's status, which shows the network, starts here."""
    arrivals = ArrivalQueues(INCOMING_PLACES[settings.network.exchange])
    # peers' shared log-probs only reach a node that weighs their completions by them
    reads_logprobs = settings.external_use.importance_weight != "off"
    extra = (logprobs_topic(settings.network.swarm),) if reads_logprobs else ()
    network: Network = await nursery.start(
        partial(serve_network, settings.network, key_pair, arrivals, counters=counters, extra_topics=extra)
    )
    live = LiveStatus(
        settings,
        network.peer_id,
        stop,
        network,
        listen=dialable_all(network.listen_addrs),
        waiting=arrivals.waiting,
    )
    for address in live.listen:
        print(f"listening on {address}", flush=True)
    return network, arrivals, live


def groups_to_fetch(settings: NodeSettings) -> int:
    """What a node asks its peers for each round: the most external groups its balance may plan,
    and a margin (none for a node that only generates)."""
    if settings.run.generate_only:
        return 0
    return groups_wanted(settings.sampling.balance_rule(trains=True).most_external)


async def fetch_until_training(network: Network, want: int, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """While the model loads and the node waits for peers, ask for groups every so often, so
    that its first round has some: they wait in the channel for the intake, as gossip's did.
    The caller cancels the scope this hands back once rounds ask for themselves."""
    with trio.CancelScope() as scope:
        task_status.started(scope)
        while True:
            network.want(want)
            await trio.sleep(FETCH_WHILE_LOADING_SECONDS)


def start_intake(
    nursery: trio.Nursery,
    node: Node,
    network: Network,
    receive: ArrivalQueues,
    settings: NodeSettings,
) -> GossipExchange:
    """The node is loaded: check what has been waiting, and everything from now on."""
    encoder = group_encoder(settings, node.peer_id, reasoning_gym_version())
    exchange = GossipExchange(network, encoder, node.memory, want=groups_to_fetch(settings))
    nursery.start_soon(exchange.receive, receive)
    return exchange


async def open_page(nursery: trio.Nursery, settings: NodeSettings, live: LiveStatus) -> NodeMetrics | None:
    """With --metrics-port, the page at /, its JSON at /api/status and Prometheus /metrics."""
    run = settings.run
    if run.metrics_port is None:
        return None
    metrics = NodeMetrics()
    port = await nursery.start(serve_page, metrics, live.snapshot, run.metrics_host, run.metrics_port)
    live.page = page_urls(run.metrics_host, port)
    print(f"page on {live.page[0]}", flush=True)
    print(f"metrics on {live.page[0]}metrics", flush=True)
    return metrics


async def load_node(
    settings: NodeSettings, peer_id: str, live: LiveStatus, counters: NodeCounters, stop: threading.Event
) -> tuple[Node, NodeState]:
    """Load (or convert) the model, warm-start it if due, resume from the last checkpoint:
    in a worker thread, so the network and the page keep answering meanwhile. The node counts
    into `counters` and stops generating when `stop` is set. The page sees it once its judge
    client is up too (`LiveStatus.node_ready`)."""
    live.phase = "loading model"
    started = time.perf_counter()
    log.info("loading %s%s", settings.model.model, " (the page shows the progress)" if live.page else "")

    def build() -> tuple[Node, NodeState]:
        with watching_warm_start(live.warm_start_step):
            node = Node(settings, peer_id, counters=counters, stop=stop)
            return node, node.start_state()

    node, state = await trio.to_thread.run_sync(build)
    policy = node.policy
    precisions = f"sampling {'bf16' if policy.generation_bf16 else 'fp32'}, update {'bf16' if policy.bf16 else 'fp32'}"
    print(f"model loaded in {time.perf_counter() - started:.1f}s ({policy.device.type}; {precisions})", flush=True)
    return node, state


async def wait_for_peers(exchange: GossipExchange, count: int, timeout: float) -> None:
    """A start-up courtesy for swarms launched together; never a precondition for training."""
    if count <= 0:
        return
    with trio.move_on_after(timeout):
        while len(exchange.peers()) < count:  # noqa: ASYNC110 - libp2p has no "peer connected" event we can wait on
            await trio.sleep(0.2)
        # one heartbeat for the subscriptions to be exchanged and the mesh to form
        await trio.sleep(1.0)
        log.info("%d peer(s) connected; starting", len(exchange.peers()))
        return
    log.warning("only %d of %d peers after %.0fs; training anyway", len(exchange.peers()), count, timeout)


async def start_judge_client(
    nursery: trio.Nursery, node: Node, key_pair, torch_lock: trio.Lock, settings: NodeSettings
) -> JudgeClient | None:
    """With --judge, a task that answers the open judge every --judge-every rounds (node/judge/client.py)."""
    run = settings.run
    if not run.judge:
        return None
    client = JudgeClient(run.judge, run.judge_every, key_pair, node.policy, torch_lock, node.training.max_new_tokens)
    await nursery.start(client.run)
    log.info("judge %s will evaluate this node every %d round(s)", run.judge, run.judge_every)
    return client


async def run_node(settings: NodeSettings, parent: int | None = None) -> Node | None:
    """Join the swarm, then build the node (resuming from its last checkpoint) and run rounds
    until done or signalled, or (for a node a swarm started) until process `parent` is gone.
    A checkpoint is written on the way out, so a clean stop loses nothing. None if it was
    stopped before the model had loaded."""
    # The last check that needs torch, made before anything is written: is the device here?
    resolve_device(settings.model.device)
    seed = settings.network.identity_seed
    key_pair = load_or_create_identity(settings.run.data_dir, bytes.fromhex(seed) if seed else None)
    peer_id = peer_id_of(key_pair)
    stop = threading.Event()
    live: LiveStatus | None = None  # once the network is up
    transport: dict[str, int] = {}  # the gossip layer's counters, reported with the node's own
    torch_lock = trio.Lock()
    node: Node | None = None
    state = start = None
    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(_cancel_on_signal, scope, stop)
                if parent is not None:
                    nursery.start_soon(_cancel_when_orphaned, parent, scope, stop)
                network, receive, live = await start_network(nursery, settings, key_pair, transport, stop)
                prefetch = await nursery.start(fetch_until_training, network, groups_to_fetch(settings))
                metrics = await open_page(nursery, settings, live)
                nursery.start_soon(live.keep_file)
                # one stop flag for the whole daemon, set by the signal handler
                node, state = await load_node(settings, peer_id, live, NodeCounters(transport=transport), stop)
                start = state
                exchange = start_intake(nursery, node, network, receive, settings)
                judge = await start_judge_client(nursery, node, key_pair, torch_lock, settings)
                live.node_ready(LoadedNode(node, judge, state))
                live.phase = "waiting for peers"
                await wait_for_peers(exchange, settings.network.wait_for_peers, settings.network.wait_for_peers_seconds)
                prefetch.cancel()  # from now on each round asks after it publishes
                live.phase = "training"

                def after_round(done: NodeState, record: RoundRecord) -> None:
                    nonlocal state
                    state = done  # what a signal mid-round leaves to checkpoint
                    live.after_round(done, record)

                await round_loop(node, state, exchange, torch_lock, metrics, after_round)
                # a signal mid-round ends the loop early, and trio may not have cancelled us yet
                live.phase = "stopped" if stop.is_set() else "finished"
                nursery.cancel_scope.cancel()
    except* LoadingStopped as stopped:
        log.info("%s", stopped.exceptions[0])
    if (
        node is not None
        and state is not None
        and start is not None
        and state.round > start.round
        and not node.checkpoint_due(state.round)
    ):
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(node.checkpoint, state)
    if live is None:  # stopped before the network was up: still, the last run's file is not ours
        data_dir = settings.run.data_dir
        last_word = NodeStatus(
            source="live",
            updated=time.time(),
            pid=os.getpid(),
            peer_id=peer_id,
            data_dir=str(data_dir),
            phase="stopped",
        )
        with contextlib.suppress(OSError):  # as LiveStatus.write_file: a full disk is no reason to fail here
            write_status_file(data_dir, last_word)
    else:
        if live.phase != "finished":
            live.phase = "stopped"
        live.write_file()
    return node
