"""An honest peer in the test's own process: a real network (protocol/network.py) that dials a
node process and publishes honest groups to it."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import trio
from libp2p.crypto.ed25519 import create_new_key_pair

from sapo.node.core.exchange import GroupEncoder
from sapo.protocol.network import Network, serve_network
from sapo.protocol.peers.identity import peer_id_of
from sapo.protocol.settings import NetworkSettings
from sapo.training.problems.tasks import reasoning_gym_version
from tests.support.groups import honest_group
from tests.support.processes import NodeProcess


class Peer:
    """An in-process network (protocol/network.py) dialling the node, publishing honest groups;
    `service` is that network, once `start` has opened it."""

    service: Network

    def __init__(
        self, seed: int, address: str, swarm_key: Path | None = None, model_id: str = "peer", exchange: str = "gossip"
    ):
        """`exchange="gossip"`: what this peer publishes goes to its mesh, as any stranger's own
        router may send it (a fetching node's router sends its rollouts only to older releases,
        protocol/exchange/older_releases.py); "fetch": it serves its groups to a node that asks."""
        self.key = create_new_key_pair(bytes([seed]) * 32)
        self.peer_id = peer_id_of(self.key)
        self.send, self.receive = trio.open_memory_channel(1000)
        self.counters: dict[str, int] = {}
        self.settings = NetworkSettings(
            listen="/ip4/127.0.0.1/tcp/0", peers=[address], swarm_key=swarm_key, dial_backoff_max=2.0, exchange=exchange
        )
        self.encoder = GroupEncoder(
            peer_id=self.peer_id, swarm="default", model_id=model_id, rg_version=reasoning_gym_version()
        )
        self.published = 0

    async def start(self, nursery) -> None:
        """Open this peer's network as a task of `nursery`."""
        self.service = await nursery.start(
            partial(serve_network, self.settings, self.key, self.send, counters=self.counters)
        )

    async def join(self, nursery, node: NodeProcess) -> None:
        """Start this peer's network and wait until it is connected to `node` and their mesh has formed."""
        await self.start(nursery)
        while node.peer_id not in self.service.connected_peers():
            await trio.sleep(0.1)
        await trio.sleep(2)  # heartbeats: the mesh forms

    async def publish_honest(self) -> None:
        """On the topic: a node reads it there with `--exchange gossip` (processes.TOPIC_PATH)."""
        if await self.service.publish(self.encoder.frame(honest_group(self.published), 1)):
            self.published += 1

    async def share_honest(self, round_index: int) -> None:
        """Into this peer's outbox, for a fetching node (the default) to ask for."""
        if await self.service.share(self.encoder.frame(honest_group(self.published), round_index), round_index):
            self.published += 1

    def received(self) -> int:
        return self.receive.statistics().current_buffer_used
