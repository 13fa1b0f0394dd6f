"""How groups leave and enter a node: over libp2p gossip, or an in-process hub for
experiments and tests. Both go through the same codec and the same intake checks."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import trio
from libp2p.peer.id import ID

from sapo.node.core.memory import NodeMemory
from sapo.node.core.settings import NodeSettings
from sapo.protocol.exchange.arrivals import Arrival
from sapo.protocol.settings import logprobs_topic
from sapo.protocol.wire.codec import canonical_bytes, encode, encode_logprobs, group_digest
from sapo.protocol.wire.messages import (
    LOGPROBS_SCHEMA_VERSION,
    BehaviorLogprobs,
    GroupLogprobs,
    RolloutGroup,
    SharedLogprobs,
    to_wire,
)
from sapo.sampling.standing import OLDER_RELEASES_PLACE, Provenance
from sapo.training.problems.rollouts import QuestionGroup

log = logging.getLogger("sapo.exchange")

# A round's shared log-probs go out in messages of about this size (more groups, more messages):
# well under any max_message_bytes a receiver may set, and under yamux's 64 KiB frames.
LOGPROBS_MESSAGE_BYTES = 48 * 1024


@dataclass(frozen=True)
class Outgoing:
    """One round's frames, to publish in this order: the log-probs first, so that they are there
    when the groups they name arrive."""

    logprobs: list[bytes]
    groups: list[bytes]


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
        return encode(self._message(group, round_index), compress=self.compress)

    def frames(self, groups: list[QuestionGroup], round_index: int) -> Outgoing:
        """A round's groups as frames, and (with share_logprobs) their log-probs as SharedLogprobs."""
        messages = [self._message(group, round_index) for group in groups]
        shared = [
            GroupLogprobs(group=group_digest(msg).hex(), behavior=BehaviorLogprobs(**group.behavior.model_dump()))
            for msg, group in zip(messages, groups)
            if self.share_logprobs and group.behavior is not None
        ]
        return Outgoing(
            logprobs=[encode_logprobs(m, compress=self.compress) for m in self._logprobs_messages(shared)],
            groups=[encode(msg, compress=self.compress) for msg in messages],
        )

    def _message(self, group: QuestionGroup, round_index: int) -> RolloutGroup:
        return to_wire(
            group,
            sender=self.peer_id,
            swarm=self.swarm,
            sender_round=round_index,
            model_id=self.model_id,
            created_at=self.clock(),
            reasoning_gym_version=self.rg_version,
        )

    def _logprobs_messages(self, entries: list[GroupLogprobs]) -> list[SharedLogprobs]:
        """Entries packed greedily into messages of about LOGPROBS_MESSAGE_BYTES (one alone may be more)."""
        batches: list[list[GroupLogprobs]] = []
        size = 0
        for entry in entries:
            entry_size = len(canonical_bytes(entry))
            if not batches or size + entry_size > LOGPROBS_MESSAGE_BYTES:
                batches.append([])
                size = 0
            batches[-1].append(entry)
            size += entry_size
        return [
            SharedLogprobs(
                schema_version=LOGPROBS_SCHEMA_VERSION,
                sender=self.peer_id,
                swarm=self.swarm,
                created_at=self.clock(),
                groups=batch,
            )
            for batch in batches
        ]


def group_encoder(
    settings: NodeSettings,
    peer_id: str,
    rg_version: str,
    clock: Callable[[], float] = time.time,
    model_id: str | None = None,
) -> GroupEncoder:
    """A node's encoder, as its settings say (the daemon's and the in-process hub's alike)."""
    net = settings.network
    return GroupEncoder(
        peer_id=peer_id,
        swarm=net.swarm,
        model_id=model_id or settings.model.model,
        rg_version=rg_version,
        compress=net.compress,
        share_logprobs=settings.external_use.share_logprobs,
        clock=clock,
    )


class GossipPort(Protocol):
    """What the exchange needs of the network (protocol/network.py's `Network`): share our groups,
    ask for others' (and say which of those it could not use), publish log-probs, who is
    connected, whether an author is banned, where an author's connection comes from, why its
    groups come on the topic by right, if they do, and what the intake accepted."""

    async def share(self, frame: bytes, round_index: int) -> bool: ...

    def want(self, count: int) -> None: ...

    def refused_fetched(self, count: int) -> None: ...

    async def publish(self, data: bytes, topic: str | None = None) -> bool: ...

    def connected_peers(self) -> list[str]: ...

    def refusal_bytes(self, peer_id: bytes) -> str | None: ...

    def penalize_sender(self, sender: str, reason: str) -> None: ...

    def network_group_of(self, peer: str) -> str | None: ...

    def by_right(self, peer: str) -> Literal["gossip", "older"] | None: ...

    def accepted(self, arrival: Arrival) -> None: ...


def groups_wanted(most_external: int) -> int:
    """Groups to fetch a round for a node that trains on at most `most_external` external groups:
    those, and a margin for groups its checks refuse or its draw passes over (0 for none)."""
    return most_external + max(2, most_external // 2) if most_external > 0 else 0


class GossipExchange:
    """`want`: the groups to fetch after each round's publish (`groups_wanted`). The one owner of
    an incoming group: the intake checks it in a worker thread and stores nothing; back on the
    trio thread the exchange keeps what it accepted in the node's memory and charges what it
    refused to the sender's peer score."""

    def __init__(self, network: GossipPort, encoder: GroupEncoder, memory: NodeMemory, want: int = 0):
        self.network = network
        self.encoder = encoder
        self.memory = memory
        self.counters = memory.counters
        self.wanted = want

    async def publish(self, groups: list[QuestionGroup], round_index: int) -> None:
        """Our round's groups out, and the next round's external groups asked for: they arrive
        on the channel `receive` reads while this round trains."""
        outgoing = self.encoder.frames(groups, round_index)
        for frame in outgoing.logprobs:
            await self.network.publish(frame, topic=logprobs_topic(self.encoder.swarm))
        for frame in outgoing.groups:
            if await self.network.share(frame, round_index):
                self.counters.published += 1
        self.network.want(self.wanted)

    def peers(self) -> list[str]:
        return sorted(self.network.connected_peers())

    async def receive(self, incoming: AsyncIterable[Arrival]) -> None:
        """Checks run in a worker thread: regenerating and re-scoring a problem is CPU work
        that must not stall the libp2p heartbeats. Frames still queued from an author banned
        since they arrived are dropped here, counted as `banned`, without a trip to the thread,
        so that a flooder's backlog does not hold up everyone else's frames. An accepted group
        earns its author standing only if this node asked for it (`provenance`), and its author is
        placed in the network group its connection comes from, so that keys behind one address
        or one relay share one budget (sampling/standing.py). A fetched group that is not kept is
        told to the network, whose fetcher then asks for another in its place (so a round's want
        fills with groups the node can train on, not with frames that came)."""
        limiter = trio.CapacityLimiter(1)
        shared = logprobs_topic(self.encoder.swarm)
        intake = self.memory.intake
        async for arrival in incoming:
            sender = arrival.sender  # the signer, or the author a fetch asked
            fetched = arrival.route == "fetch"
            if self.network.refusal_bytes(_peer_bytes(sender)) == "banned":
                self.counters.rejected["banned"] += 1
                if fetched:
                    self.network.refused_fetched(1)
                continue
            logprobs = arrival.route == "gossip" and arrival.topic == shared
            accept = intake.accept_logprobs if logprobs else intake.accept
            verdict = await trio.to_thread.run_sync(accept, arrival.data, sender, arrival.received_at, limiter=limiter)
            if verdict.refusal is not None:
                self.network.penalize_sender(sender, verdict.refusal)
            if fetched and verdict.group is None:
                self.network.refused_fetched(1)
            if verdict.group is not None:
                self.network.accepted(arrival)
                source = self.provenance(arrival)
                # the inbox's eviction weighs every author it holds: work for a worker, not the loop
                await trio.to_thread.run_sync(self._store, verdict.group, arrival.received_at, source, limiter=limiter)

    def provenance(self, arrival: Arrival) -> Provenance:
        """Whether this node asked for an accepted group, and where its author is placed. Asked:
        one it fetched from its author, or one on the topic from an author whose groups come
        there by right (an older release, which cannot be fetched, or anyone with --exchange
        gossip; in fetch mode the topic refuses any other author's before its signature is
        checked, pubsub_guards.py's `unasked`, and this says so again). Placed: in the network
        group its connection comes from, but an older release's group on the topic in
        OLDER_RELEASES_PLACE, one place for every key that claims to be one (sampling/standing.py).
        The sender is the group's author on both routes: the intake refuses a group whose origin
        is not its signer or the peer asked (`sender_mismatch`)."""
        right = None if arrival.route == "fetch" else self.network.by_right(arrival.sender)
        place = OLDER_RELEASES_PLACE if right == "older" else self.network.network_group_of(arrival.sender)
        return Provenance(arrival.route == "fetch" or right is not None, place)

    def _store(self, group: QuestionGroup, now: float, provenance: Provenance) -> None:
        try:
            self.memory.store(group, now, provenance)
        except Exception:  # a bug in the inbox or standing must not take the receive loop down
            self.counters.rejected["internal_error"] += 1
            log.exception("could not keep a group from %s", group.origin[:16])


def _peer_bytes(peer: str) -> bytes:
    try:
        return ID.from_base58(peer).to_bytes()
    except Exception:  # noqa: BLE001 - gossip only hands us ids libp2p decoded
        return b""
