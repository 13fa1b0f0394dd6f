"""Who runs what: this node says `sapo/<version>` in libp2p identify, and learns what each peer says.

py-libp2p 0.8.1 answers identify with its own agent string ("py-libp2p/0.8.1"), a module constant
read on every answer, and keeps no record of the agent strings peers send it (its peerstore
stores their keys, addresses and protocols only). So a host this project builds answers with
ours (`identify_as`: libp2p's own handler, with the agent field of its answer replaced), and
`PeerAgents` asks each connected peer once. Our version: release.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio
from libp2p.identity.identify.identify import ID as IDENTIFY
from libp2p.identity.identify.identify import identify_handler_for
from libp2p.identity.identify.pb.identify_pb2 import Identify
from libp2p.peer.id import ID
from libp2p.utils import decode_varint_with_size, varint
from libp2p.utils.varint import read_length_prefixed_protobuf

from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.training.bounded import BoundedMap

logger = logging.getLogger("sapo.agents")

# One identify answer is a key, a few addresses, a protocol list and a signed record: ~1-2 KB.
MAX_IDENTIFY_BYTES = 64 * 1024
ASK_TIMEOUT_SECONDS = 5.0
# How often connected peers are checked for ones not asked yet, and how many are asked at once.
CHECK_SECONDS = 2.0
ASKS_AT_ONCE = 4
# A peer that did not answer is asked again after this long.
RETRY_SECONDS = 60.0
# Agent strings kept (peers that left included, for the status page), and their length. As many
# failed asks are remembered (with when to ask again); forgetting one only lets it be asked sooner.
MAX_REMEMBERED = 1024
MAX_AGENT_CHARS = 128


def identify_as(host: Any, agent: str) -> Callable[[Any], Any]:
    """libp2p's identify handler for `host`, answering with `agent` as its agent_version."""
    answer = identify_handler_for(host, use_varint_format=True)

    async def handle(stream: Any) -> None:
        try:
            await answer(_AgentStamped(stream, agent))  # type: ignore[arg-type]  # the stream, duck-typed
        except Exception as error:  # noqa: BLE001 - raised in a stream handler, it ends the swarm and the node
            logger.warning("identify answer failed: %s: %s", type(error).__name__, error)
            with trio.move_on_after(1.0):
                try:
                    await stream.reset()
                except Exception:  # noqa: BLE001 - already gone is fine
                    pass

    return handle


class _AgentStamped:
    """A stream whose one identify answer (a varint length, then the protobuf) gets our agent
    string; everything else goes to the stream untouched."""

    def __init__(self, stream: Any, agent: str) -> None:
        self._stream = stream
        self._agent = agent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def write(self, data: bytes) -> None:
        length, size = decode_varint_with_size(data)
        if size > 0 and size + length == len(data):
            message = Identify()
            message.ParseFromString(data[size:])
            message.agent_version = self._agent
            body = message.SerializeToString()
            data = varint.encode_uvarint(len(body)) + body
        await self._stream.write(data)


class PeerAgents:
    """The agent string each peer's identify gave, asked once per peer (again after a failure)."""

    def __init__(self, host: Any, peers: Callable[[], list[ID]], gate: PeerGate) -> None:
        self.host = host
        self.peers = peers  # the peers connected now
        self.may_ask = gate.may_use  # not banned, allowed
        self._agents: BoundedMap[str, str] = BoundedMap(MAX_REMEMBERED)
        self._failed: BoundedMap[str, float] = BoundedMap(MAX_REMEMBERED)  # peer -> when to ask it again
        self._asking: set[str] = set()

    def agents(self) -> dict[str, str]:
        return dict(self._agents.items())

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        limiter = trio.CapacityLimiter(ASKS_AT_ONCE)
        async with trio.open_nursery() as nursery:
            while True:
                now = trio.current_time()
                for peer in self.peers():
                    name = peer.to_base58()
                    if name in self._agents or name in self._asking or now < self._failed.get(name, -1.0):
                        continue
                    self._failed.pop(name, None)  # its wait is over
                    if self.may_ask(peer):
                        self._asking.add(name)
                        nursery.start_soon(self._ask, peer, limiter)
                await trio.sleep(CHECK_SECONDS)

    async def _ask(self, peer: ID, limiter: trio.CapacityLimiter) -> None:
        name = peer.to_base58()
        try:
            async with limiter:
                agent = await self.ask(peer)
        finally:
            self._asking.discard(name)
        if agent is None:
            # bounded: a node meets peers that fail once and leave, for months
            self._failed.put(name, trio.current_time() + RETRY_SECONDS)
            return
        self._failed.pop(name, None)
        self._agents.put(name, agent)

    async def ask(self, peer: ID) -> str | None:
        """`peer`'s agent string, printable and bounded, or None if it did not answer in time."""
        stream = None
        with trio.move_on_after(ASK_TIMEOUT_SECONDS):
            try:
                stream = await self.host.new_stream(peer, [IDENTIFY])
                data = await read_length_prefixed_protobuf(
                    stream, use_varint_format=True, max_length=MAX_IDENTIFY_BYTES
                )
                message = Identify()
                message.ParseFromString(data)
                return "".join(c for c in message.agent_version[:MAX_AGENT_CHARS] if c.isprintable()) or "(none)"
            except Exception as error:  # noqa: BLE001 - a peer that cannot answer is asked again later
                logger.debug("identify of %s failed: %s: %s", peer, type(error).__name__, error)
            finally:
                if stream is not None:
                    with trio.CancelScope(deadline=trio.current_time() + 1.0, shield=True):
                        try:
                            await stream.close()
                        except Exception:  # noqa: BLE001
                            pass
        return None
