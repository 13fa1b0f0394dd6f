"""How groups leave and enter a node: over libp2p gossip, or an in-process hub for
experiments and tests. Both go through the same codec and the same intake checks."""

from __future__ import annotations

import logging
import time
from typing import Callable

import trio

from sapo.node.daemon.counters import NodeCounters
from sapo.node.daemon.intake import Intake
from sapo.protocol.codec import encode
from sapo.protocol.gossip import GossipService, ReceivedMessage
from sapo.protocol.messages import BehaviorLogprobs, to_wire
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
