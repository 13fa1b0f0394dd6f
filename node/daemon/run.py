"""The node daemon: one trio nursery holding the network service, the receive loop and the
round loop, shut down by cancelling it on SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import signal
from typing import Callable

import trio

from sapo.node.daemon.node import Node
from sapo.node.daemon.exchange import GossipExchange, GroupEncoder
from sapo.node.daemon.intake import Intake
from sapo.node.judge.client import JudgeClient
from sapo.node.daemon.metrics import RoundRecord
from sapo.node.daemon.prometheus import NodeMetrics, serve_metrics
from sapo.node.daemon.round import Exchange, run_round
from sapo.node.daemon.settings import NodeSettings
from sapo.protocol.codec import DecodeLimits
from sapo.protocol.gossip import GossipService, ReceivedMessage
from sapo.protocol.identity import load_or_create_identity, peer_id_of
from sapo.protocol.peer_guard import PENALTIES
from sapo.protocol.verify import VerifyPolicy
from sapo.training.devices import resolve_device
from sapo.training.generation import GenerationInterrupted
from sapo.training.tasks import reasoning_gym_version

log = logging.getLogger("sapo.node")

# Verified groups wait here between the network and the intake checks; beyond it, the
# gossip layer drops (and counts) rather than blocking the network on a slow node.
INCOMING_BUFFER = 256


async def round_loop(
    node: Node,
    exchange: Exchange,
    torch_lock: trio.Lock,
    metrics: NodeMetrics | None = None,
    after_round: Callable[[RoundRecord], None] | None = None,
) -> None:
    """Run rounds until --rounds; `after_round` (the judge client) sees each record and must not block."""
    rounds = node.settings.run.rounds
    round_index = node.round + 1
    if rounds and round_index > rounds:
        log.info("already at round %d of %d; nothing to do", node.round, rounds)
        return
    while not rounds or round_index <= rounds:
        try:
            record = (await run_round(node, exchange, node.plan(round_index), torch_lock)).record
        except GenerationInterrupted:
            return  # shutting down; this round never happened
        log.info(record.log_line())
        if metrics is not None:
            metrics.observe(record)
        if after_round is not None:
            after_round(record)
        round_index += 1


async def _cancel_on_signal(
    scope: trio.CancelScope, node: Node, *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            log.info("received %s; finishing cleanly", signal.Signals(signum).name)
            # A worker thread cannot be cancelled from trio: ask the generation loop to stop.
            # An update in progress finishes, so the weights always match a whole round.
            node.stop_requested.set()
            scope.cancel()
            return


async def start_gossip(nursery: trio.Nursery, node: Node, key_pair, settings: NodeSettings) -> GossipExchange:
    """Start the libp2p service and the receive loop; print the address peers dial."""
    net = settings.network
    send, receive = trio.open_memory_channel[ReceivedMessage](INCOMING_BUFFER)
    service = GossipService(net, key_pair, send, counters=node.counters.transport)
    rg_version = reasoning_gym_version()
    intake = Intake(
        node.inbox,
        node.counters,
        swarm=net.swarm,
        local_peer_id=node.peer_id,
        rg_version=rg_version,
        limits=DecodeLimits(max_message_bytes=net.max_message_bytes),
        policy=VerifyPolicy(accept_other_rg_versions=net.accept_other_rg_versions),
        max_age_seconds=settings.sampling.inbox_max_age_seconds,
        verifier=node.verifier,
        on_reject=lambda signer, reason: _report_from_worker(service, signer, reason),
    )
    encoder = GroupEncoder(
        peer_id=node.peer_id, swarm=net.swarm, model_id=settings.model.model, rg_version=rg_version, compress=net.compress,
        share_logprobs=net.share_logprobs,
    )
    exchange = GossipExchange(service, encoder, intake, node.counters)
    await nursery.start(service.run)
    nursery.start_soon(exchange.receive, receive)
    for address in service.listen_addrs:
        print(f"listening on {address}", flush=True)
    return exchange


def _report_from_worker(service: GossipService, signer: str, reason: str) -> None:
    """The intake runs in a worker thread; the peer score lives in the trio thread."""
    if PENALTIES.get(reason, 0) <= 0:
        return  # duplicates, stale groups, version skew: nothing to charge, no thread hop
    try:
        trio.from_thread.run_sync(service.penalize_sender, signer, reason)
    except (trio.RunFinishedError, trio.Cancelled, RuntimeError):
        pass  # shutting down, or called outside a trio worker (nothing to score then)


async def wait_for_peers(exchange: GossipExchange, count: int, timeout: float) -> None:
    """A start-up courtesy for swarms launched together; never a precondition for training."""
    if count <= 0:
        return
    with trio.move_on_after(timeout):
        while len(exchange.peers()) < count:
            await trio.sleep(0.2)
        # one heartbeat for the subscriptions to be exchanged and the mesh to form
        await trio.sleep(1.0)
        log.info("%d peer(s) connected; starting", len(exchange.peers()))
        return
    log.warning("only %d of %d peers after %.0fs; training anyway", len(exchange.peers()), count, timeout)


async def start_judge_client(
    nursery: trio.Nursery, node: Node, key_pair, torch_lock: trio.Lock, settings: NodeSettings
) -> JudgeClient | None:
    """With --judge, a task that answers the open judge every --judge-every rounds (node/judge_client.py)."""
    net = settings.network
    if not net.judge:
        return None
    client = JudgeClient(net.judge, net.judge_every, key_pair, node.policy, torch_lock, node.training.max_new_tokens)
    await nursery.start(client.run)
    log.info("judge %s will evaluate this node every %d round(s)", net.judge, net.judge_every)
    return client


async def run_node(settings: NodeSettings) -> Node:
    """Build the node (resuming from its last checkpoint), join the swarm, and run rounds
    until done or signalled. A checkpoint is written on the way out, so a clean stop loses nothing."""
    # The last check that needs torch, made before anything is written: is the device here?
    resolve_device(settings.model.device)
    seed = settings.network.identity_seed
    key_pair = load_or_create_identity(settings.run.data_dir, bytes.fromhex(seed) if seed else None)
    node = await trio.to_thread.run_sync(Node, settings, peer_id_of(key_pair))
    torch_lock = trio.Lock()
    start_round = node.round
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(_cancel_on_signal, scope, node)
            exchange = await start_gossip(nursery, node, key_pair, settings)
            metrics = None
            if settings.run.metrics_port is not None:
                metrics = NodeMetrics()
                port = await nursery.start(serve_metrics, metrics, settings.run.metrics_host, settings.run.metrics_port)
                print(f"metrics on http://{settings.run.metrics_host}:{port}/metrics", flush=True)
            judge = await start_judge_client(nursery, node, key_pair, torch_lock, settings)
            await wait_for_peers(exchange, settings.network.wait_for_peers, settings.network.wait_for_peers_seconds)
            await round_loop(node, exchange, torch_lock, metrics, judge.round_done if judge else None)
            nursery.cancel_scope.cancel()
    if node.round > start_round and not node.checkpoint_due(node.round):
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(node.checkpoint)
    return node
