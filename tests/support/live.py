"""A daemon's `LiveStatus` for tests of what it keeps (the page's curves, its memory), without a
running network: one that has no peers yet, as a daemon's network is in its first second."""

from __future__ import annotations

import threading

from sapo.node.core.settings import NodeSettings
from sapo.node.daemon.live import LiveStatus
from sapo.protocol.network import NetworkStatus


class NoPeersYet:
    def status(self) -> NetworkStatus:
        return NetworkStatus(
            reachability="unknown",
            relaying=False,
            relayed_addrs=[],
            advertised_addrs=[],
            connected=[],
            addresses={},
            agents={},
            scores={},
            bans=[],
            counters={},
        )


def live_status(settings: NodeSettings, peer_id: str = "peer") -> LiveStatus:
    return LiveStatus(settings, peer_id, threading.Event(), NoPeersYet(), listen=[], waiting=lambda: 0)
