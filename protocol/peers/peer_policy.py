"""Who may connect, send or be dialled, and who pays for what: the allow list, the peer score and
its bans (peer_guard.py), in one object that the network (network.py) builds first and hands,
method by method, to the guards that ask."""

from __future__ import annotations

import logging
from collections.abc import Callable

from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from sapo.protocol.peers.peer_guard import PeerGuard
from sapo.protocol.settings import NetworkSettings
from sapo.protocol.toolkit.hosts import peer_str

logger = logging.getLogger("sapo.gossip")


class PeerPolicy:
    """The allow list and the peer guard. `count(name)` counts; `on_ban(peer)` hears of each
    ban, after it is counted and logged (the network cuts the peer's connections then)."""

    def __init__(
        self, settings: NetworkSettings, my_id: ID, count: Callable[[str], None], on_ban: Callable[[ID], None]
    ) -> None:
        self.my_id = my_id
        self.ban_seconds = settings.ban_seconds
        self.allowed: frozenset[bytes] | None = (
            frozenset(ID.from_base58(peer).to_bytes() for peer in settings.allow_peers)
            if settings.allow_peers
            else None
        )
        self.guard = PeerGuard(settings.peer_message_rate, settings.peer_message_burst, settings.ban_seconds)
        self.count = count
        self.on_ban = on_ban

    def is_allowed_bytes(self, peer_id: bytes) -> bool:
        return self.allowed is None or peer_id == self.my_id.to_bytes() or peer_id in self.allowed

    def refusal(self, peer_id: ID) -> str | None:
        """Why this peer may not connect, send or be dialled ('not_allowed', 'banned'), or None."""
        return self.refusal_bytes(peer_id.to_bytes())

    def refusal_bytes(self, peer_id: bytes) -> str | None:
        if peer_id == self.my_id.to_bytes():
            return None
        if not self.is_allowed_bytes(peer_id):
            return "not_allowed"
        if self.guard.is_banned(peer_id):
            return "banned"
        return None

    def may_use(self, peer_id: ID) -> bool:
        return self.refusal(peer_id) is None

    def admit_author(self, msg: rpc_pb2.Message, forwarder: ID) -> str | None:
        """Charge a new message to its author's bucket; why it is dropped, or None."""
        # libp2p numbers an author's publishes (8 bytes, big-endian): the gaps in what an author
        # sends us itself show how fast it really publishes (peer_guard.py: not what others forward).
        seqno = int.from_bytes(msg.seqno, "big") if 0 < len(msg.seqno) <= 8 else None
        direct = forwarder.to_bytes() == msg.from_id
        verdict = self.guard.admit(msg.from_id, seqno, direct=direct)
        if verdict == "rate_limited" and self.guard.is_banned(msg.from_id):
            self._banned(ID(msg.from_id), verdict)
        # The signature was checked for nothing: its forwarder pays (peer_guard.py). A message
        # numbered below its author's highest that its bucket of such messages still admits is
        # not charged: gossip reorders honest messages (an older release's IWANT answers bring
        # 30 at once), and the bucket bounds what a replayer gets for free.
        if verdict == "replayed" or (verdict == "rate_limited" and not direct):
            self.penalize(forwarder, "wasted_check")
        return verdict

    def penalize(self, peer_id: ID, reason: str) -> None:
        """Charge a peer for an offence named by a reject reason (see peer_guard.PENALTIES);
        past the threshold it is banned and disconnected."""
        if peer_id == self.my_id:
            return
        if self.guard.penalize(peer_id.to_bytes(), reason):
            self._banned(peer_id, reason)

    def penalize_sender(self, sender: str, reason: str) -> None:
        """`penalize` for the application's checks, which name the signer in base58."""
        try:
            peer_id = ID.from_base58(sender)
        except Exception:  # noqa: BLE001 - the intake only passes ids libp2p gave it
            return
        self.penalize(peer_id, reason)

    def banned_peers(self) -> list[str]:
        return sorted(peer_str(peer) for peer in self.guard.banned())

    def _banned(self, peer_id: ID, reason: str) -> None:
        self.count("peers_banned")
        logger.warning(
            "banned peer %s for %.0f s: score fell below the threshold (last offence: %s)",
            peer_id,
            self.ban_seconds,
            reason,
        )
        self.on_ban(peer_id)
