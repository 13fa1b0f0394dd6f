"""The one gate every service of the network asks about a peer.

go-libp2p hands its host one `ConnectionGater`; the network (network.py) hands each of its
services one `PeerGate`, built once from its policy (protocol/peers/peer_policy.py: the allow list, the score
and its bans) and its memory of which optional protocols each peer lacks (protocol/peers/peer_protocols.py):
- `refusal(peer)`: why the peer may not connect, send, be served or be dialled, or None
  (`may_use` says the same as a bool);
- `penalize(peer, reason)`: charge it for an offence (peer_guard.PENALTIES);
- `count(name, amount=1)`: the network's counters;
- `lacks(peer, protocol)`: the peer is known not to speak an optional protocol: do not ask it;
- `refused(peer, protocol, error)`: a failed ask says the peer lacks the protocol (remembered).

A test builds one from the functions it needs; the others let everyone in and count nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from libp2p.peer.id import ID


def _nobody(peer: ID) -> str | None:
    return None


def _no_charge(peer: ID, reason: str) -> None:
    return None


def _no_count(name: str, amount: int = 1) -> None:
    return None


def _lacks_nothing(peer: ID, protocol: str) -> bool:
    return False


def _never_refused(peer: ID, protocol: str, error: BaseException) -> bool:
    return False


@dataclass(frozen=True)
class PeerGate:
    """Who may be used, who pays, what a peer lacks, and the counters: see the module docstring."""

    refusal: Callable[[ID], str | None] = _nobody
    penalize: Callable[[ID, str], None] = _no_charge
    count: Callable[..., None] = _no_count
    lacks: Callable[[ID, str], bool] = _lacks_nothing
    refused: Callable[[ID, str, BaseException], bool] = _never_refused

    def may_use(self, peer: ID) -> bool:
        return self.refusal(peer) is None
