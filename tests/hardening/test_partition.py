"""Three real nodes in their own network namespaces, joined by veth pairs to a bridge that
lives in a fourth namespace: no address is ever added to the root namespace. One node's link
is cut for 30 s, then restored; training never stops, and gossip heals.

Addresses 10.77.0.x exist only inside the test's namespaces, which are deleted afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of
from tests.support.processes import PLUMBING, NodeProcess, since, wait_for

CUT_SECONDS = 30
HEAL_BOUND_SECONDS = 60


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


@pytest.fixture
def namespaces():
    """A bridge namespace and three node namespaces, each with one veth to the bridge."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's `ip`")
    tag = f"sh{os.getpid() % 100000}"
    bridge = f"{tag}-br"
    names = [f"{tag}-n{i}" for i in range(3)]
    created: list[str] = []
    try:
        for ns in [bridge, *names]:
            result = ip("netns", "add", ns, check=False)
            if result.returncode != 0:
                pytest.skip(f"`ip netns add` is not permitted here: {result.stderr.strip()}")
            created.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", bridge, "link", "set", "br0", "up")
        addresses = []
        for i, ns in enumerate(names):
            # create the pair inside the bridge namespace, then move one end to the node's
            ip("-n", bridge, "link", "add", f"vb{i}", "type", "veth", "peer", "name", f"ve{i}")
            ip("-n", bridge, "link", "set", f"ve{i}", "netns", ns)
            ip("-n", bridge, "link", "set", f"vb{i}", "master", "br0")
            ip("-n", bridge, "link", "set", f"vb{i}", "up")
            address = f"10.77.0.{11 + i}"
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", f"ve{i}")
            ip("-n", ns, "link", "set", f"ve{i}", "up")
            addresses.append(address)
        yield bridge, names, addresses
    finally:
        for ns in reversed(created):
            ip("netns", "del", ns, check=False)


def received(node: NodeProcess) -> int:
    rows = node.metrics()
    return rows[-1]["received"] if rows else 0


def test_cut_link_for_30s_then_heal(tmp_path, namespaces, nodes):
    bridge, names, addresses = namespaces
    dirs = [tmp_path / f"n{i}" for i in range(3)]
    ids = [peer_id_of(load_or_create_identity(d)) for d in dirs]
    full = [f"/ip4/{a}/tcp/4001/p2p/{p}" for a, p in zip(addresses, ids)]
    for i, ns in enumerate(names):
        peers = [full[j] for j in range(3) if j != i]
        nodes.append(
            NodeProcess(
                dirs[i],
                [*PLUMBING, "--peers", *peers],
                prefix=["ip", "netns", "exec", ns],
                listen=f"/ip4/{addresses[i]}/tcp/4001",
                start_timeout=90,
            )
        )
    assert [n.peer_id for n in nodes] == ids

    def hears_both(i: int) -> bool:
        rows = nodes[i].metrics()
        return bool(rows) and all(rows[-1]["accepted_from"].get(ids[j], 0) > 0 for j in range(3) if j != i)

    for i in range(3):
        wait_for(lambda: hears_both(i), timeout=120, interval=0.5, what=f"node {i} to hear both others")

    cut = nodes[2]
    ip("-n", bridge, "link", "set", "vb2", "down")
    rounds_at_cut = [n.last_round() for n in nodes]
    time.sleep(3)  # groups already in flight may still land
    received_after_grace = received(cut)
    time.sleep(CUT_SECONDS - 3)
    received_before_restore = received(cut)
    rounds_at_restore = [n.last_round() for n in nodes]
    assert all(n.alive() for n in nodes)
    assert all(b > a for a, b in zip(rounds_at_cut, rounds_at_restore)), (rounds_at_cut, rounds_at_restore)
    assert received_before_restore == received_after_grace, "the cut node received groups through a down link"
    others_from_cut = [n.metrics()[-1]["accepted_from"].get(ids[2], 0) for n in nodes[:2]]

    ip("-n", bridge, "link", "set", "vb2", "up")
    restored_at = time.time()

    def healed() -> bool:
        rows = since(cut.metrics(), restored_at)
        cut_hears = rows and rows[-1]["received"] > received_before_restore and any(r["external_groups"] for r in rows)
        others_hear = all(
            n.metrics()[-1]["accepted_from"].get(ids[2], 0) > before for n, before in zip(nodes[:2], others_from_cut)
        )
        return cut_hears and others_hear

    wait_for(healed, timeout=HEAL_BOUND_SECONDS, interval=0.25, what="gossip to heal after the link came back")
    heal = time.time() - restored_at
    print(
        f"\npartition: {CUT_SECONDS}s cut; rounds during the cut {[b - a for a, b in zip(rounds_at_cut, rounds_at_restore)]};"
        f" heal time {heal:.1f}s (bound {HEAL_BOUND_SECONDS}s)"
    )
    assert heal <= HEAL_BOUND_SECONDS
