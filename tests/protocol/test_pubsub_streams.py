"""Our pubsub stream opened again on a link where its first open failed (protocol/reach/pubsub_streams.py).

The first test is the bug and the fix on real nodes: in a network namespace of its own, each of
two runs links two networks and stalls the link for 12 s the moment it comes (nftables drops its
packets; tests/support/stalled_pubsub_open.py), so both pubsub opens time out. Without the
module (py-libp2p 0.8.1 alone) the peer never enters `pubsub.peers` while the link lasts, and
nothing published reaches it; with it, it does at the loop's first pass past MIN_LINK_SECONDS.
The two runs go side by side: about 35 s.

The second one checks on a real link, on 127.0.0.1, whom the loop holds and how often it tries:
never a blacklisted peer, a peer whose open failed not again before its wait is over, and it then
again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import trio

from sapo.protocol.reach import pubsub_streams
from tests.support.gossip import start_node
from tests.support.stalled_pubsub_open import STALL_SECONDS

RUN_TIMEOUT_SECONDS = 90


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


@pytest.fixture
def namespaces():
    """Two network namespaces with only their loopback up: one for each run."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nft") is None:
        pytest.skip("stalling a link needs root, iproute2's `ip` and nftables' `nft`")
    names = [f"pst{os.getpid() % 100000}-{mode}" for mode in ("on", "off")]
    created: list[str] = []
    try:
        for name in names:
            result = ip("netns", "add", name, check=False)
            if result.returncode != 0:
                pytest.skip(f"`ip netns add` is not permitted here: {result.stderr.strip()}")
            created.append(name)
            ip("-n", name, "link", "set", "lo", "up")
        yield names
    finally:
        for name in created:
            ip("netns", "del", name, check=False)


def test_a_link_stalled_as_it_came_is_deaf_for_good_without_the_loop_and_heard_with_it(namespaces):
    runs = {
        mode: subprocess.Popen(
            ["ip", "netns", "exec", space, sys.executable, "-m", "tests.support.stalled_pubsub_open", mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode, space in zip(("on", "off"), namespaces)
    }
    results = {}
    for mode, run in runs.items():
        out, err = run.communicate(timeout=RUN_TIMEOUT_SECONDS)
        assert run.returncode == 0, f"the {mode} run failed:\n{err[-3000:]}"
        results[mode] = json.loads(out.strip().splitlines()[-1])
    on, off = results["on"], results["off"]
    assert not off["at_stall_end"] and not on["at_stall_end"], results  # the first open failed in both
    assert off["linked_throughout"] and on["linked_throughout"], results  # and the link lasted
    assert off["joined_after_s"] is None and not off["received"], results  # deaf for good, alone
    bound = pubsub_streams.MIN_LINK_SECONDS + pubsub_streams.CHECK_SECONDS + 2.0
    assert on["joined_after_s"] is not None and STALL_SECONDS <= on["joined_after_s"] <= bound, results
    assert on["received"], results
    assert on["counters"] == {"pubsub_streams_reopened": 1}, results


def passes_by_hand(monkeypatch) -> None:
    """Every linked peer due at once, and no pass but those the test makes."""
    monkeypatch.setattr(pubsub_streams, "MIN_LINK_SECONDS", 0.0)
    monkeypatch.setattr(pubsub_streams, "CHECK_SECONDS", 3600.0)


async def linked_pair(nursery):
    """Two real nodes, a dialled b, once a's pubsub has b's stream."""
    b = await start_node(nursery)
    a = await start_node(nursery, peers=[b.addr])
    await a.service.pubsub.wait_for_peer(b.service.my_id, timeout=10)
    return a, b


async def test_the_loop_holds_no_blacklisted_peer_and_waits_after_a_failed_try(monkeypatch):
    passes_by_hand(monkeypatch)
    monkeypatch.setattr(pubsub_streams, "FIRST_WAIT_SECONDS", 1.0)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a, b = await linked_pair(nursery)
            b_id, pubsub = b.service.my_id, a.service.pubsub
            streams = pubsub_streams.PubsubStreams(a.service.host, pubsub, a.service.gate)  # its passes, one by one
            protocol = streams.protocol
            while b_id not in a.service.host._identified_peers:  # identify lists gossip for b
                await trio.sleep(0.05)

            pubsub.add_to_blacklist(b_id)  # tears our stream down; the link stays
            while b_id in pubsub.peers:
                await trio.sleep(0.05)
            assert await streams.reopen() == 0
            assert b_id not in pubsub.peers and not a.counters.get("pubsub_streams_reopen_failed")

            # b refuses our stream now (identify, from before, still lists it): one failed try
            pubsub.remove_from_blacklist(b_id)
            b.service.host.remove_stream_handler(protocol)
            assert await streams.reopen() == 0
            assert a.counters.get("pubsub_streams_reopen_failed") == 1
            assert await streams.reopen() == 0  # its wait is not over: not tried
            assert a.counters.get("pubsub_streams_reopen_failed") == 1

            b.service.host.set_stream_handler(protocol, b.service.pubsub.stream_handler)
            await trio.sleep(1.1)
            assert await streams.reopen() == 1
            assert b_id in pubsub.peers and a.counters.get("pubsub_streams_reopened") == 1
            assert streams.deaf() == [] and len(streams._tries) == 0  # nothing kept once it opened
            nursery.cancel_scope.cancel()


async def test_an_open_stuck_past_its_time_bound_has_its_link_cut_and_the_pass_goes_on(monkeypatch):
    """h-atk9's finding 2: the library resets a failed stream in a shielded scope, and a peer that
    stops reading holds that reset for as long as the link lasts; our time bound cannot cancel it.
    Here the open is held the same way (shielded, for ever), on a real link: the link is cut
    STUCK_SECONDS after the bound, and the pass returns."""
    passes_by_hand(monkeypatch)
    monkeypatch.setattr(pubsub_streams, "OPEN_TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(pubsub_streams, "STUCK_SECONDS", 1.0)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a, b = await linked_pair(nursery)
            b_id, pubsub = b.service.my_id, a.service.pubsub
            stuck = trio.Event()

            async def held_for_ever(peer, timeout=15.0):
                with trio.CancelScope(shield=True):
                    stuck.set()
                    while a.service.host.get_network().get_connections(peer):
                        await trio.sleep(0.05)  # what a reset waiting on a dead write does until the link goes

            pubsub.add_to_blacklist(b_id)  # our stream down, the link up
            while b_id in pubsub.peers:
                await trio.sleep(0.05)
            pubsub.remove_from_blacklist(b_id)
            monkeypatch.setattr(pubsub, "ensure_peer_stream", held_for_ever)
            streams = pubsub_streams.PubsubStreams(a.service.host, pubsub, a.service.gate)
            started = trio.current_time()
            assert await streams.reopen() == 0
            assert stuck.is_set() and trio.current_time() - started < 1.0 + 1.0 + 5.0
            assert a.counters.get("pubsub_streams_stuck_cut") == 1
            assert not a.service.host.get_network().get_connections(b_id)  # the link was cut
            nursery.cancel_scope.cancel()
