"""How groups leave and enter a node: over libp2p gossip, or an in-process hub for
experiments and tests. Both go through the same codec and the same intake checks."""

from __future__ import annotations

import logging
import time
from typing import Callable

import trio

from sapo.node.daemon.counters import NodeCounters
from sapo.node.daemon.intake import Intake
from sapo.node.daemon.settings import NodeSettings
from sapo.protocol.codec import DecodeLimits, encode
from sapo.protocol.gossip import GossipService, ReceivedMessage
from sapo.protocol.messages import BehaviorLogprobs, to_wire
from sapo.protocol.verify import VerifyPolicy
from sapo.sampling.inbox import Inbox
from sapo.training.rewards import Verifier
from sapo.training.rollouts import QuestionGroup

log = logging.getLogger("sapo.exchange")


class GroupEncoder:
    """Turns this node's local groups into signed-sender wire frames."""

    def __init__(
        self,
        *,
        peer_id: str,
        swarm: str,
        model_id: str,
        rg_version: str,
        compress: bool = True,
        share_logprobs: bool = False,
        clock: Callable[[], float] = time.time,
    ):
        # `clock` stamps created_at; the experiment harness passes its simulated round clock.
        self.clock = clock
        self.peer_id = peer_id
        self.swarm = swarm
        self.model_id = model_id
        self.rg_version = rg_version
        self.compress = compress
        self.share_logprobs = share_logprobs

    def frame(self, group: QuestionGroup, round_index: int) -> bytes:
        msg = to_wire(
            group,
            sender=self.peer_id,
            swarm=self.swarm,
            sender_round=round_index,
            model_id=self.model_id,
            created_at=self.clock(),
            reasoning_gym_version=self.rg_version,
            behavior=BehaviorLogprobs(**group.behavior.model_dump()) if self.share_logprobs and group.behavior else None,
        )
        return encode(msg, compress=self.compress)


def group_encoder(
    settings: NodeSettings, peer_id: str, rg_version: str, clock: Callable[[], float] = time.time, model_id: str | None = None
) -> GroupEncoder:
    """A node's encoder, as its settings say (the daemon's and the in-process hub's alike)."""
    net = settings.network
    return GroupEncoder(
        peer_id=peer_id, swarm=net.swarm, model_id=model_id or settings.model.model, rg_version=rg_version,
        compress=net.compress, share_logprobs=settings.external_use.share_logprobs, clock=clock,
    )


def node_intake(
    settings: NodeSettings,
    inbox: Inbox,
    counters: NodeCounters,
    *,
    peer_id: str,
    rg_version: str,
    verifier: Verifier,
    on_reject: Callable[[str, str], None] | None = None,
) -> Intake:
    """A node's intake checks in front of its inbox, as its settings say (the daemon's and the
    in-process hub's alike)."""
    net = settings.network
    return Intake(
        inbox,
        counters,
        swarm=net.swarm,
        local_peer_id=peer_id,
        rg_version=rg_version,
        limits=DecodeLimits(max_message_bytes=net.max_message_bytes),
        policy=VerifyPolicy(accept_other_rg_versions=net.accept_other_rg_versions),
        max_age_seconds=settings.sampling.inbox_max_age_seconds,
        verifier=verifier,
        on_reject=on_reject,
    )


class GossipExchange:
    def __init__(self, service: GossipService, encoder: GroupEncoder, intake: Intake, counters: NodeCounters):
        self.service = service
        self.encoder = encoder
        self.intake = intake
        self.counters = counters

    async def publish(self, groups: list[QuestionGroup], round_index: int) -> None:
        for group in groups:
            if await self.service.publish(self.encoder.frame(group, round_index)):
                self.counters.published += 1

    def peers(self) -> list[str]:
        return sorted(self.service.connected_peers())

    async def receive(self, incoming: trio.MemoryReceiveChannel[ReceivedMessage]) -> None:
        """Checks run in a worker thread: regenerating and re-scoring a problem is CPU work
        that must not stall the libp2p heartbeats."""
        limiter = trio.CapacityLimiter(1)
        async for message in incoming:
            await trio.to_thread.run_sync(
                self.intake.accept, message.data, message.sender, message.received_at, limiter=limiter
            )
