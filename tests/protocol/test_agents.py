"""Our hosts say `sapo/<version>` in libp2p identify (the version from pyproject.toml, through
the installed package's metadata), and a node learns what each peer says; a bare py-libp2p host
says what py-libp2p says. Real hosts on 127.0.0.1."""

from __future__ import annotations

import tomllib
from pathlib import Path

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr

from sapo.protocol.toolkit.agents import PeerAgents
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.protocol.toolkit.release import agent_string, sapo_version
from tests.support.gossip import start_node

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_version_is_pyprojects():
    assert sapo_version() == tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    assert agent_string() == f"sapo/{sapo_version()}"


async def test_each_peer_says_what_it_runs():
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery)
        b = await start_node(nursery, peers=[a.addr])
        bare = new_host(key_pair=create_new_key_pair())  # py-libp2p as it comes
        async with bare.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            await bare.connect(info_from_p2p_addr(multiaddr.Multiaddr(a.addr)))
            bare_id = bare.get_id().to_base58()
            with trio.fail_after(20):
                while set(a.service.status().agents) != {b.service.peer_id, bare_id}:
                    await trio.sleep(0.1)
            assert a.service.status().agents == {b.service.peer_id: agent_string(), bare_id: "py-libp2p/0.8.1"}
            # and the bare host, asking our node the standard way, hears ours
            agents = PeerAgents(bare, lambda: [], PeerGate())
            assert await agents.ask(a.service.host.get_id()) == agent_string()
        nursery.cancel_scope.cancel()
