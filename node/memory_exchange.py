"""An in-process exchange for experiments: every frame goes through the wire codec and each
receiver's Intake (decode, sender and swarm checks, regeneration, re-scoring, inbox), exactly as
over gossip, but delivery is a function call and time is a round clock, so a study is
deterministic.

Frames published during a round are held until `deliver()`; the experiment calls it once all
nodes have generated, so round r's groups are visible to every other node in round r.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sapo.node.counters import NodeCounters
from sapo.node.exchange import GroupEncoder
from sapo.node.intake import Intake
from sapo.protocol.codec import DecodeLimits
from sapo.protocol.verify import VerifyPolicy
from sapo.sampling.inbox import Inbox
from sapo.training.rollouts import QuestionGroup

Clock = Callable[[], float]


@dataclass
class Member:
    peer_id: str
    encoder: GroupEncoder
    intake: Intake | None  # None: the member never trains on external groups, so it skips checks
    counters: NodeCounters


class MemoryHub:
    def __init__(self, clock: Clock, swarm: str, rg_version: str):
        self.clock = clock
        self.swarm = swarm
        self.rg_version = rg_version
        self.members: list[Member] = []
        self._pending: list[tuple[str, bytes]] = []

    def join(
        self,
        peer_id: str,
        *,
        model_id: str,
        inbox: Inbox | None,
        counters: NodeCounters,
        max_message_bytes: int,
        max_age_seconds: float,
        accept_other_rg_versions: bool = False,
        compress: bool = True,
    ) -> "MemoryExchange":
        """Add a member; with `inbox=None` it only publishes."""
        encoder = GroupEncoder(
            clock=self.clock, peer_id=peer_id, swarm=self.swarm, model_id=model_id, rg_version=self.rg_version, compress=compress
        )
        intake = None
        if inbox is not None:
            intake = Intake(
                inbox,
                counters,
                swarm=self.swarm,
                local_peer_id=peer_id,
                rg_version=self.rg_version,
                limits=DecodeLimits(max_message_bytes=max_message_bytes),
                policy=VerifyPolicy(accept_other_rg_versions=accept_other_rg_versions),
                max_age_seconds=max_age_seconds,
            )
        member = Member(peer_id, encoder, intake, counters)
        self.members.append(member)
        return MemoryExchange(self, member)

    def deliver(self) -> int:
        """Hand every held frame to every other receiving member, in join order; returns frames delivered."""
        delivered = 0
        now = self.clock()
        for sender, frame in self._pending:
            for member in self.members:
                if member.intake is not None and member.peer_id != sender:
                    member.intake.accept(frame, sender, now)
                    delivered += 1
        self._pending.clear()
        return delivered


class MemoryExchange:
    """One member's handle: the same publish/peers surface as GossipExchange, but synchronous."""

    def __init__(self, hub: MemoryHub, member: Member):
        self.hub = hub
        self.member = member

    def publish(self, groups: list[QuestionGroup], round_index: int) -> None:
        for group in groups:
            self.hub._pending.append((self.member.peer_id, self.member.encoder.frame(group, round_index)))
            self.member.counters.published += 1

    def peers(self) -> list[str]:
        return [m.peer_id for m in self.hub.members if m.peer_id != self.member.peer_id]
