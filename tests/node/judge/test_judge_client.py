"""The node side: due every K rounds, never queued, and a dead judge costs a log line only."""

import socket
import time

import trio
from libp2p.crypto.ed25519 import create_new_key_pair

from sapo.node.judge.client import JudgeClient
from sapo.protocol.peers.identity import peer_id_of


class Record:
    def __init__(self, round, peers=(), accepted_from=None, external_groups=0):
        self.round, self.peers, self.external_groups = round, list(peers), external_groups
        self.accepted_from = accepted_from or {}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_client(every=2, port=None):
    judge_id = peer_id_of(create_new_key_pair())
    address = f"/ip4/127.0.0.1/tcp/{port or closed_port()}/p2p/{judge_id}"
    return JudgeClient(address, every, create_new_key_pair(), policy=None, torch_lock=trio.Lock(), max_new_tokens=8)


def test_round_done_marks_every_kth_round_due_and_skips_when_one_is_pending():
    client = make_client(every=2)
    client.round_done(Record(1, peers=["a"]))
    client.round_done(Record(2, accepted_from={"b": 3}, external_groups=2))
    client.round_done(Record(4, peers=["a"]))  # round 2 not yet taken: skipped, not queued
    assert client._due_receive.receive_nowait() == 2
    assert client.counters == {"skipped_busy": 1}
    assert client._peers_seen == {"a", "b"} and client._external_groups == 2


async def test_a_dead_judge_is_logged_and_training_goes_on(nursery):
    client = make_client(every=1)
    await nursery.start(client.run)
    started = time.monotonic()
    assert await client.evaluate(5) is None
    assert time.monotonic() - started < 15
    assert client.counters == {"judge_unreachable": 1}
