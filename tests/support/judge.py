"""The judge service in the test's process on 127.0.0.1, and scripted clients that speak its wire
by hand (no model)."""

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr

from sapo.node.judge.server import DB_FILE_NAME, JudgeService, JudgeSettings, ResultStore
from sapo.protocol.toolkit.hosts import new_noise_host
from sapo.protocol.wire import judge_wire as wire

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


async def start_judge(nursery, tmp_path, tasks: list[str]) -> JudgeService:
    """A judge on loopback; close its `store` when done."""
    settings = JudgeSettings(data_dir=tmp_path, listen=LOOPBACK, tasks=tasks, request_timeout_seconds=5)
    service = JudgeService(settings, create_new_key_pair(), ResultStore(tmp_path / DB_FILE_NAME))
    # The test plays the judge's operator, who alone knows the answer keys (the wire does not carry them).
    issued, draw = [], service._next_spec
    service._next_spec = lambda: issued.append(draw()) or issued[-1]
    service.issued = issued
    await nursery.start(service.run)
    return service


class Client:
    """A dial-only host with its own key, speaking the wire by hand."""

    def __init__(self, host, judge_addr):
        self.host, self.judge = host, info_from_p2p_addr(multiaddr.Multiaddr(judge_addr))
        self.peer_id = host.get_id().to_base58()

    async def open(self):
        with trio.fail_after(10):
            await self.host.connect(self.judge)
            return await self.host.new_stream(self.judge.peer_id, [wire.PROTOCOL_ID])

    def request(self, **overrides):
        fields = dict(peer_id=self.peer_id, model_id="scripted", node_round=3, swarm_peers_seen=1)
        return wire.EvalRequest(**{**fields, **overrides})


async def client(nursery, judge) -> Client:
    """A client with a host of its own, running in `nursery`, for the `judge` service."""
    host = new_noise_host(create_new_key_pair(), [multiaddr.Multiaddr(LOOPBACK)])
    ready = trio.Event()
    done = trio.Event()

    async def run():
        async with host.run([multiaddr.Multiaddr(LOOPBACK)]):
            ready.set()
            await done.wait()
            await host.close()

    nursery.start_soon(run)
    await ready.wait()
    return Client(host, judge.listen_addrs[0])


async def ask(stream, request) -> wire.Question:
    """Send `request`; the question the judge asks back."""
    with trio.fail_after(10):
        await wire.write_message(stream, request)
        return await wire.read_message(stream, wire.Question)


async def reply(stream, question, text) -> float:
    """Answer `question` with `text`; the judge's score."""
    with trio.fail_after(10):
        await wire.write_message(stream, wire.Answer(id=question.id, text=text))
        return (await wire.read_message(stream, wire.Score)).score
