"""`PeerAgents` remembers failed identify asks (to wait before asking again) for a bounded
number of peers: a node that meets thousands of short-lived peers for months must not keep
one entry for each. No network: `ask` is replaced by one that never gets an answer."""

from __future__ import annotations

import trio

from sapo.protocol.toolkit.agents import CHECK_SECONDS, MAX_REMEMBERED, RETRY_SECONDS, PeerAgents
from sapo.protocol.toolkit.peer_gate import PeerGate


class _Peer:
    def __init__(self, name: str) -> None:
        self.name = name

    def to_base58(self) -> str:
        return self.name


class _Silent(PeerAgents):
    """Every peer fails to answer."""

    def __init__(self, peers: list[_Peer]) -> None:
        super().__init__(host=None, peers=lambda: peers, gate=PeerGate())
        self.asked: list[str] = []

    async def ask(self, peer) -> str | None:
        self.asked.append(peer.to_base58())
        return None


async def test_failed_asks_are_remembered_for_the_latest_max_remembered_peers_only():
    agents = _Silent([])
    limiter = trio.CapacityLimiter(1)
    for n in range(3 * MAX_REMEMBERED):
        await agents._ask(_Peer(f"peer-{n}"), limiter)
    assert len(agents._failed) == MAX_REMEMBERED
    remembered = list(agents._failed)
    assert remembered[0] == f"peer-{2 * MAX_REMEMBERED}" and remembered[-1] == f"peer-{3 * MAX_REMEMBERED - 1}"


async def test_a_peer_that_failed_is_asked_again_after_the_wait_and_not_before(autojump_clock):
    peer = _Peer("slow")
    agents = _Silent([peer])
    async with trio.open_nursery() as nursery:
        await nursery.start(agents.run)
        await trio.sleep(RETRY_SECONDS - 2 * CHECK_SECONDS)
        assert agents.asked == ["slow"]  # checked every CHECK_SECONDS, but waiting
        await trio.sleep(4 * CHECK_SECONDS)
        assert agents.asked == ["slow", "slow"]
        assert list(agents._failed) == ["slow"]  # one entry per peer, however often it fails
        nursery.cancel_scope.cancel()
