"""A running `sapo-node start` process, over real libp2p: an unsigned message and wrongly signed
ones are refused and counted by reason (metrics.jsonl and /metrics), the same peer's properly
signed group still gets in, and the node keeps running rounds."""

from __future__ import annotations

import re
import urllib.request

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import PUBSUB_SIGNING_PREFIX, Pubsub

from sapo.protocol.settings import rollout_topic
from tests.support.groups import honest_group
from tests.support.peer import Peer
from tests.support.processes import PLUMBING, TOPIC_PATH, NodeProcess

TOPIC = rollout_topic("default")


def forged(pubsub, data: bytes, *, signer, key_of) -> rpc_pb2.Message:
    """A message from `pubsub`'s peer id, signed by `signer`, carrying `key_of`'s public key."""
    msg = rpc_pb2.Message(data=data, topicIDs=[TOPIC], from_id=pubsub.my_id.to_bytes(), seqno=pubsub._next_seqno())
    msg.signature = signer.private_key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
    msg.key = key_of.public_key.serialize()
    return msg


async def test_running_node_counts_unsigned_and_wrongly_signed_messages_and_keeps_training(tmp_path, nodes):
    node = NodeProcess(tmp_path / "n", [*PLUMBING, *TOPIC_PATH, "--metrics-port", "0"])
    nodes.append(node)
    with trio.fail_after(10):  # after the listening line: "page on URL", then "metrics on URL/metrics"
        lines = [await trio.to_thread.run_sync(node.proc.stdout.readline) for _ in range(2)]
    metrics_url = re.search(r"metrics on (http://\S+/metrics)", lines[1]).group(1)
    attacker = Peer(0x21, node.address, model_id="forger")
    frame = attacker.encoder.frame(honest_group(), 1)  # a group the node would accept if signed right
    stranger = create_new_key_pair(b"\x22" * 32)

    with trio.fail_after(50):
        async with trio.open_nursery() as nursery:
            await attacker.join(nursery, node)
            rounds_before = node.last_round()
            pubsub = attacker.service.pubsub

            pubsub.strict_signing = False  # our side neither signs nor checks, as a hostile client would
            assert await attacker.service.publish(frame)  # 1. no signature at all
            # 2. signed by another key, carrying our key; 3. signed by and carrying another key
            for message in (
                forged(pubsub, frame, signer=stranger, key_of=attacker.key),
                forged(pubsub, frame, signer=stranger, key_of=stranger),
            ):
                await Pubsub.push_msg(pubsub, pubsub.my_id, message)
            pubsub.strict_signing = True
            await trio.sleep(1)
            assert await attacker.service.publish(frame)  # 4. the same group, signed properly

            while True:
                rows = node.metrics()
                last = rows[-1] if rows else {"rejected": {}, "transport": {}, "accepted_from": {}}
                if (
                    last["transport"].get("bad_signature", 0) >= 2
                    and last["transport"].get("unsigned")
                    and last["accepted_from"].get(attacker.peer_id)
                ):
                    break
                assert node.alive(), node.log_text()[-3000:]
                await trio.sleep(0.3)
            target = last["round"] + 2  # and it keeps training
            while node.last_round() < target:
                assert node.alive(), node.log_text()[-3000:]
                await trio.sleep(0.3)
            nursery.cancel_scope.cancel()

    last = node.metrics()[-1]
    assert last["round"] > rounds_before
    assert last["transport"]["unsigned"] == 1 and last["transport"]["bad_signature"] == 2
    assert last["rejected"]["unsigned"] == 1 and last["rejected"]["bad_signature"] == 2
    assert last["accepted_from"][attacker.peer_id] == 1  # only the properly signed copy got in
    assert not last["transport"].get("peers_banned")  # three bad messages cost score, not a ban
    body = urllib.request.urlopen(metrics_url, timeout=10).read().decode()  # noqa: ASYNC210 - after the run, nothing else waits
    assert re.search(r'^sapo_rejected_groups_total\{reason="unsigned"\} 1\.0$', body, re.M), body[-2000:]
    assert re.search(r'^sapo_rejected_groups_total\{reason="bad_signature"\} 2\.0$', body, re.M), body[-2000:]
