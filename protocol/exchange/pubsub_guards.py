"""The guards py-libp2p 0.8.1's Pubsub lacks, as a subclass whose every override calls the
original (protocol/README.md, "Transport"). It touches private internals of that exact release,
which is why pyproject pins `libp2p==0.8.1`. The policy (who is refused, who pays for what)
stays in protocol/peers/peer_policy.py and delivery in gossip.py; this module only puts their checks (the
network's `PeerGate`, the author's bucket, the delivery) where libp2p would otherwise crash, drop
silently or interleave frames."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import trio
from libp2p.host.exceptions import StreamFailure
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.validators import signature_validator

from sapo.protocol.toolkit.hosts import cut_connections
from sapo.protocol.toolkit.peer_gate import PeerGate

logger = logging.getLogger("sapo.gossip")

# libp2p's per-peer outbound queue holds 32 RPCs; at 50 msg/s that is 0.6 s of slack before
# silent drops. 128 slots is 2.5 s, and at most 128 x 256 KiB = 32 MiB per slow peer.
OUTBOUND_QUEUE_SLOTS = 128


# An identity multihash of a protobuf Ed25519 public key: 0x00 (identity), 36 bytes follow, key
# type 1 (Ed25519), 32 bytes of key.
ED25519_ID_PREFIX = b"\x00\x24\x08\x01\x12\x20"


def is_ed25519_id(peer_id: bytes) -> bool:
    return len(peer_id) == 38 and peer_id.startswith(ED25519_ID_PREFIX)


class GuardedPubsub(Pubsub):
    """Pubsub with the guards py-libp2p 0.8.1 lacks; every override calls the original.

    - `stream_handler`: a malformed frame makes `continuously_read_stream` raise protobuf's
      DecodeError, which libp2p does not catch and which ends `host.run()` (any peer could
      kill the node with 16 bytes). We drop that peer's stream and connection instead.
    - `push_msg`: runs as a service task per inbound message; an exception there (e.g. a
      garbage public key in `msg.key`) would cancel the whole pubsub service.
    - `write_msg`: the per-peer sender, GossipSub's flush and its mcache replay write to the
      same stream concurrently; yamux then interleaves the 64 KB frames of big messages and
      the receiver sees garbage. One lock per stream serialises whole RPC frames.
    - `notify_subscriptions`: deliver straight to the network instead of through libp2p's
      32-slot subscription channel, which drops silently when full.
    - `_handle_new_peer`: one open per peer at a time (two at once registered it twice and
      leaked a sender task), enlarge the 32-slot per-peer outbound queue (not a constructor
      argument in 0.8.1), and do not open a gossip stream to a peer that lacks gossipsub (a
      relay that does not gossip): it is remembered once (protocol/peers/peer_protocols.py), not retried.
    - With an allowlist, a peer not on it is disconnected when pubsub first sees it (either
      direction), and a message it signed or forwarded is dropped before validation, so it
      neither receives our messages nor gets its own delivered or relayed. A banned peer
      (protocol/peers/peer_guard.py) is treated the same way until its ban expires.
    - Before any signature is checked, a message whose author is not an Ed25519 key named in
      its peer id is dropped (`unsupported_key`), and in fetch mode so is a group on the
      rollouts topic that nobody asked for (`unasked`, `pushed_refused`): neither charges anyone
      or leaves any state behind.
    - Every new message's author draws from its token bucket once its signature has checked
      out; a message over the bucket is dropped before validation (so not relayed either),
      and unsigned or badly signed messages, bad frames and messages that make libp2p raise
      cost the peer that sent them.
    """

    def __init__(
        self,
        *args: Any,
        gate: PeerGate,
        admit_author: Callable[[rpc_pb2.Message, ID], str | None],
        deliver: Callable[[rpc_pb2.Message, bytes], None],
        unasked: Callable[[rpc_pb2.Message], bool] | None,
        close_timeout: float,
        **kwargs: Any,
    ) -> None:
        """`gate`: who may connect or send, who pays, which peers lack gossip (protocol/toolkit/peer_gate.py);
        `admit_author(msg, forwarder)` charges a new message to its author's bucket (protocol/peers/peer_policy.py) and
        says why it is dropped, or None; `deliver(msg, message_id)` hands a message on our
        topics to the node (gossip.py); `unasked(msg)` says a group came on the rollouts topic
        unasked (fetch mode, gossip.py: refused before anything else is spent on it), None in
        gossip mode; `close_timeout` bounds cutting a peer off."""
        super().__init__(*args, **kwargs)
        self.gate = gate
        self.admit_author = admit_author
        self.deliver = deliver
        self.unasked = unasked
        self._me = self.my_id.to_bytes()  # asked of every message: computed once
        self.close_timeout = close_timeout
        self._write_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = weakref.WeakKeyDictionary()
        self._opening: dict[ID, trio.Event] = {}  # peers whose stream is being opened: one open each

    async def _refuse(self, peer_id: ID, reason: str, stream: Any = None) -> None:
        self.gate.count(reason)
        logger.info("refusing peer %s: %s", peer_id, reason)
        with trio.move_on_after(self.close_timeout):
            if stream is not None:
                try:
                    await stream.reset()
                except Exception:
                    pass
            await cut_connections(self.host, peer_id)

    async def stream_handler(self, stream: Any) -> None:
        peer_id = stream.muxed_conn.peer_id
        refusal = self.gate.refusal(peer_id)
        if refusal is not None:
            await self._refuse(peer_id, refusal, stream)
            return
        try:
            await super().stream_handler(stream)
        except Exception as error:  # hostile input must cost the sender, not this node
            self.gate.count("malformed_frame")
            self.gate.penalize(peer_id, "malformed_frame")
            logger.warning("dropping peer %s: bad pubsub frame (%s: %s)", peer_id, type(error).__name__, error)
            with trio.move_on_after(self.close_timeout):
                try:
                    await stream.reset()
                except Exception:
                    pass
                self._handle_dead_peer(peer_id)
                await cut_connections(self.host, peer_id)

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        gate = self.gate
        refusal = gate.refusal(msg_forwarder) or gate.refusal(ID(msg.from_id))
        if refusal is not None:
            gate.count(refusal)
            return
        if msg_forwarder != self.my_id and not self._is_msg_seen(msg):
            # Before any signature is checked: only an Ed25519 key named inline in the peer id
            # is cheap to verify (libp2p takes any RSA key, and one with a 4,095-bit exponent
            # costs 16-32 ms a check), and every sapo release signs with one. Nobody is charged:
            # an honest peer may forward what a stranger signed.
            if not is_ed25519_id(msg.from_id):
                gate.count("unsupported_key")
                return
            if self.unasked is not None and msg.from_id != self._me and self.unasked(msg):
                gate.count("pushed_refused")
                return
            # libp2p drops these silently under strict signing; check first so they are counted
            # and charged to the peer that sent them (honest peers check before forwarding).
            if not msg.signature:
                gate.count("unsigned")
                gate.penalize(msg_forwarder, "unsigned")
                return
            try:
                valid = signature_validator(msg)
            except Exception:  # noqa: BLE001 - a garbage key is a bad signature too
                valid = False
            if not valid:
                gate.count("bad_signature")
                gate.penalize(msg_forwarder, "bad_signature")
                return
            # The signature names the author: now its bucket, not the relay's, pays.
            verdict = self.admit_author(msg, msg_forwarder)
            if verdict is not None:
                gate.count(verdict)
                return
        try:
            await super().push_msg(msg_forwarder, msg)
        except Exception as error:  # hostile input must cost the peer that sent it
            gate.count("malformed_message")
            gate.penalize(msg_forwarder, "malformed_message")
            logger.warning(
                "dropped message forwarded by %s: %s: %s",
                msg_forwarder,
                type(error).__name__,
                error,
            )

    async def write_msg(self, stream: Any, rpc_msg: rpc_pb2.RPC) -> bool:
        lock = self._write_locks.get(stream)
        if lock is None:
            lock = self._write_locks[stream] = trio.Lock()
        async with lock:
            return await super().write_msg(stream, rpc_msg)

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        if any(topic in self.topic_ids for topic in publish_message.topicIDs):
            self.deliver(publish_message, self.get_message_id(publish_message))

    async def _handle_new_peer(self, peer_id: ID) -> None:
        refusal = self.gate.refusal(peer_id)
        if refusal is not None:
            await self._refuse(peer_id, refusal)
            return
        if self.gate.lacks(peer_id, self.protocols[0]):
            return
        # One open per peer at a time: libp2p checks `peers` before its awaits and then
        # overwrites `peers` and `peer_queues`, so two overlapping opens (a connection's notifee,
        # the dead-peer retry, protocol/reach/pubsub_streams.py) registered the peer twice, and the
        # first sender task waited for ever on a queue nobody held
        # (tests/hardening/test_attack9_double_registration.py). A second open waits for the
        # first, then finds the peer registered, or opens itself.
        while (opening := self._opening.get(peer_id)) is not None:
            await opening.wait()
        done = self._opening[peer_id] = trio.Event()
        try:
            await super()._handle_new_peer(peer_id)
        except StreamFailure as error:
            if not self.gate.refused(peer_id, self.protocols[0], error):
                raise
            return
        finally:
            del self._opening[peer_id]
            done.set()
        queue = self.peer_queues.get(peer_id)
        if queue is not None:
            queue._queue.max_size = max(queue._queue.max_size, OUTBOUND_QUEUE_SLOTS)


class Forgets(Protocol):
    """Discovery, as the ban's cut-off needs it (discovery.py)."""

    def forget(self, peer_id: ID) -> None: ...


def queue_ban(bans: trio.MemorySendChannel[ID], peer: ID) -> None:
    """Hand a banned peer to `cut_off_banned`, never blocking the check that banned it."""
    try:
        bans.send_nowait(peer)
    except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
        logger.warning("could not queue the disconnect of banned peer %s; it is refused on its next frame", peer)


async def cut_off_banned(
    bans: trio.MemoryReceiveChannel[ID], host: Any, discovery: Forgets, close_timeout: float
) -> None:
    """Each banned peer: forget its record (so we neither dial nor recommend it) and cut its
    connections now, each cut its own task (a flooder can hold a polite close off for seconds)."""

    async def disconnect(peer: ID) -> None:
        with trio.move_on_after(close_timeout):
            await cut_connections(host, peer)
        logger.info("dropped the connection to banned peer %s", peer)

    async with trio.open_nursery() as nursery:
        async for peer in bans:
            discovery.forget(peer)
            nursery.start_soon(disconnect, peer)
