"""An in-process exchange for studies and tests: every frame goes through the wire codec and
each receiver's Intake (decode, sender and swarm checks, regeneration, re-scoring) and memory,
exactly as over gossip, but delivery is a function call and time is whatever clock it is given.

With `lockstep=True` (the study) a member's `publish` for round r waits until every member has
published its round-r groups; then the hub hands all of them to every other member, in join
order, and everyone goes on to mix. So node k's round-r groups are visible to the others in the
same round r, as in the paper's controlled run, and a study is deterministic whatever order its
nodes run in. Without lockstep a publish is delivered at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from sapo.node.core.counters import NodeCounters
from sapo.node.core.exchange import GroupEncoder, group_encoder
from sapo.node.core.memory import NodeMemory
from sapo.node.core.settings import NodeSettings
from sapo.sampling.standing import ASKED
from sapo.training.problems.rollouts import QuestionGroup

Clock = Callable[[], float]


@dataclass
class Member:
    peer_id: str
    encoder: GroupEncoder
    memory: NodeMemory | None  # None: the member never trains on external groups, so it skips checks
    counters: NodeCounters
    joins_at: int = 1  # the first round it takes part in: before it, it neither publishes nor receives
    pending: list[bytes] = field(default_factory=list)
    pending_logprobs: list[bytes] = field(default_factory=list)  # delivered before the groups, as over gossip


class MemoryHub:
    def __init__(self, clock: Clock, rg_version: str, lockstep: bool = False):
        self.clock = clock
        self.rg_version = rg_version
        self.lockstep = lockstep
        self.members: list[Member] = []
        self._published: dict[int, int] = {}  # round -> members that have published it
        self._delivered: dict[int, trio.Event] = {}

    def join(
        self,
        peer_id: str,
        settings: NodeSettings,
        *,
        memory: NodeMemory | None,
        counters: NodeCounters,
        joins_at: int = 1,
        model_id: str | None = None,
    ) -> MemoryExchange:
        """Add a member whose encoder is what its `settings` make of it, as over gossip, and whose
        frames its node's intake checks and its memory keeps; with `memory=None` it only
        publishes. A lockstep round waits only for members that have joined by then
        (`joins_at`), and only they receive its groups."""
        encoder = group_encoder(settings, peer_id, self.rg_version, self.clock, model_id)
        member = Member(peer_id, encoder, memory, counters, joins_at)
        self.members.append(member)
        return MemoryExchange(self, member)

    async def publish(self, member: Member, groups: list[QuestionGroup], round_index: int) -> None:
        outgoing = member.encoder.frames(groups, round_index)
        member.pending_logprobs += outgoing.logprobs
        member.pending += outgoing.groups
        member.counters.published += len(groups)
        if not self.lockstep:
            self.deliver()
            return
        done = self._delivered.setdefault(round_index, trio.Event())
        published = self._published.get(round_index, 0) + 1
        if published < sum(1 for m in self.members if m.joins_at <= round_index):
            self._published[round_index] = published
            await done.wait()
            return
        # the last member of the round to publish delivers everyone's groups
        self._published.pop(round_index, None)
        del self._delivered[round_index]
        self.deliver(round_index)
        done.set()

    def idle(self) -> bool:
        """Nothing published is waiting for its round or its delivery (a study's run checkpoints then)."""
        return not self._published and not any(m.pending or m.pending_logprobs for m in self.members)

    def deliver(self, round_index: int | None = None) -> int:
        """Hand every held frame to every other receiving member (of those that have joined by
        `round_index`, if given), senders in join order; returns the frames delivered."""
        delivered = 0
        now = self.clock()
        receivers = [
            (m, m.memory)
            for m in self.members
            if m.memory is not None and (round_index is None or m.joins_at <= round_index)
        ]
        for sender in self.members:
            for frame in sender.pending_logprobs:
                for member, memory in receivers:
                    if member is not sender:
                        memory.intake.accept_logprobs(frame, sender.peer_id, now)
            for frame in sender.pending:
                for member, memory in receivers:
                    if member is not sender:
                        verdict = memory.intake.accept(frame, sender.peer_id, now)
                        if verdict.group is not None:  # what a study's member asks for is everyone's round
                            memory.store(verdict.group, now, ASKED)
                        delivered += 1
            sender.pending.clear()
            sender.pending_logprobs.clear()
        return delivered


class MemoryExchange:
    """One member's handle on the hub: the same `Exchange` surface as GossipExchange."""

    def __init__(self, hub: MemoryHub, member: Member):
        self.hub = hub
        self.member = member

    async def publish(self, groups: list[QuestionGroup], round_index: int) -> None:
        await self.hub.publish(self.member, groups, round_index)

    def peers(self) -> list[str]:
        return [m.peer_id for m in self.hub.members if m is not self.member]
