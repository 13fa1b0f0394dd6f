"""A peer without an optional protocol, on real hosts on 127.0.0.1: found out once (from
identify, or from its refusal), logged once at INFO, counted once, never an ERROR."""

import logging

import multiaddr
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr

from sapo.protocol.exchange.discovery import PROTOCOL_ID as DISCOVERY
from sapo.protocol.peers.peer_protocols import REMEMBER_SECONDS, PeerProtocols, quiet_refusals, refused_protocol
from sapo.protocol.toolkit.hosts import new_noise_host
from tests.support.hosts import run_host

LOOPBACK = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")


async def connected_pair(nursery):
    """(us, them): two listening hosts, `us` connected to `them`, which serves nothing of ours."""
    us, them = (new_noise_host(create_new_key_pair(), [LOOPBACK]) for _ in range(2))
    for host in (us, them):
        await nursery.start(run_host, host)
    await us.connect(info_from_p2p_addr(them.get_addrs()[0]))
    return us, them


async def test_identify_tells_us_once_and_the_peer_is_not_asked(caplog):
    counts: dict[str, int] = {}
    with trio.fail_after(20), caplog.at_level(logging.INFO, logger="sapo.gossip"):
        async with trio.open_nursery() as nursery:
            us, them = await connected_pair(nursery)
            protocols = PeerProtocols(us, lambda name: counts.__setitem__(name, counts.get(name, 0) + 1))
            while them.get_id() not in us._identified_peers:
                assert not protocols.lacks(them.get_id(), DISCOVERY)  # not identified yet: ask and see
                await trio.sleep(0.05)
            assert all(protocols.lacks(them.get_id(), DISCOVERY) for _ in range(5))
            assert not protocols.lacks(them.get_id(), "/ipfs/id/1.0.0")  # what identify does list
            nursery.cancel_scope.cancel()
    assert counts == {"peers_without_discovery": 1}
    lines = [r for r in caplog.records if "does not speak" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO, lines
    assert DISCOVERY in lines[0].getMessage() and "identify does not list it" in lines[0].getMessage()


async def test_after_a_while_the_peer_is_asked_once_more_and_quietly(caplog):
    # identify is a snapshot: a peer may have started serving the protocol since
    counts: dict[str, int] = {}
    now = [0.0]
    with trio.fail_after(20), caplog.at_level(logging.INFO, logger="sapo.gossip"):
        async with trio.open_nursery() as nursery:
            us, them = await connected_pair(nursery)
            protocols = PeerProtocols(
                us, lambda name: counts.__setitem__(name, counts.get(name, 0) + 1), clock=lambda: now[0]
            )
            while them.get_id() not in us._identified_peers:
                await trio.sleep(0.05)
            assert protocols.lacks(them.get_id(), DISCOVERY)
            now[0] += REMEMBER_SECONDS + 1
            assert not protocols.lacks(them.get_id(), DISCOVERY)  # ask once more
            assert protocols.lacks(them.get_id(), DISCOVERY)  # identify still says no: remembered again
            nursery.cancel_scope.cancel()
    assert counts == {"peers_without_discovery": 1}
    assert len([r for r in caplog.records if "does not speak" in r.getMessage()]) == 1


async def refused_stream(quiet: bool) -> tuple[BaseException, PeerProtocols, dict]:
    counts: dict[str, int] = {}
    async with trio.open_nursery() as nursery:
        us, them = await connected_pair(nursery)
        protocols = PeerProtocols(us, lambda name: counts.__setitem__(name, counts.get(name, 0) + 1))
        with pytest.raises(Exception) as raised:
            if quiet:
                async with quiet_refusals():
                    await us.new_stream(them.get_id(), [DISCOVERY])
            else:
                await us.new_stream(them.get_id(), [DISCOVERY])
        assert protocols.refused(them.get_id(), DISCOVERY, raised.value)
        assert protocols.refused(them.get_id(), DISCOVERY, raised.value)  # remembered: counted once
        assert protocols.lacks(them.get_id(), DISCOVERY)
        nursery.cancel_scope.cancel()
    return raised.value, protocols, counts


async def test_a_refused_stream_is_remembered_and_is_no_error_in_the_library_log(libp2p_records):
    with trio.fail_after(20):
        _, _, counts = await refused_stream(quiet=True)
    assert counts == {"peers_without_discovery": 1}
    failures = [r for r in libp2p_records if r.getMessage().startswith("Failed to open stream")]
    assert not failures, [(r.levelname, r.getMessage()[:80]) for r in failures]


async def test_without_quiet_refusals_the_library_logs_a_refusal_as_an_error(libp2p_records):
    # Why quiet_refusals exists. If this starts failing, py-libp2p stopped calling it an error.
    with trio.fail_after(20):
        await refused_stream(quiet=False)
    failures = [r for r in libp2p_records if r.getMessage().startswith("Failed to open stream")]
    assert [r.levelno for r in failures] == [logging.ERROR]
    assert "protocols not supported" in failures[0].getMessage()


def test_only_a_refusal_means_the_peer_lacks_the_protocol():
    try:
        try:
            raise ValueError("protocols not supported: tried ['/sapo/peers/1'], timeout=5s")
        except ValueError as cause:
            raise RuntimeError("failed to open a stream to peer X") from cause
    except RuntimeError as wrapped:
        assert refused_protocol(wrapped)
    assert not refused_protocol(TimeoutError("response timed out after 5s, protocols tried: ['/sapo/peers/1']"))
    assert not refused_protocol(ConnectionResetError("stream reset"))
