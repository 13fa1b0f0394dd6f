"""A running node bans a peer whose properly signed groups keep failing its checks: the intake's
rejections (in a worker thread) reach the gossip layer's peer score, and the peer is cut off
and refused, while the node keeps training."""

from __future__ import annotations

import trio

from tests.support.groups import honest_group
from tests.support.peer import Peer
from tests.support.processes import PLUMBING, TOPIC_PATH, NodeProcess


async def test_peer_sending_junk_groups_is_banned_and_cut_off(tmp_path, nodes):
    node = NodeProcess(tmp_path / "n", [*PLUMBING, *TOPIC_PATH])
    nodes.append(node)
    junk = Peer(0x31, node.address, model_id="junk")
    group = honest_group()

    def spoofed(i: int):  # distinct questions, so each counts as spoofed and none as a repeat
        honest = honest_group(1 + i)
        return honest.model_copy(update={"problem": honest.problem.model_copy(update={"answer": "12345"})})

    with trio.fail_after(50):
        async with trio.open_nursery() as nursery:
            await junk.join(nursery, node)
            assert await junk.service.publish(junk.encoder.frame(group, 1))  # one honest group first
            for i in range(6):  # then junk: 10 points each, banned at -100
                assert await junk.service.publish(b"\xde\xad junk %d" % i)  # bad_frame
                assert await junk.service.publish(junk.encoder.frame(spoofed(i), 2 + i))  # spoofed_answer_key
                await trio.sleep(0.1)
            while True:
                rows = node.metrics()
                if rows and rows[-1]["transport"].get("peers_banned"):
                    break
                assert node.alive(), node.log_text()[-3000:]
                await trio.sleep(0.3)
            with trio.fail_after(10):  # cut off, and kept out although it keeps redialling
                while node.peer_id in junk.service.connected_peers():
                    await trio.sleep(0.1)
            target = rows[-1]["round"] + 2
            while node.last_round() < target:
                assert node.alive(), node.log_text()[-3000:]
                await trio.sleep(0.3)
            nursery.cancel_scope.cancel()

    last = node.metrics()[-1]
    assert last["transport"]["peers_banned"] == 1
    assert last["rejected"]["bad_frame"] + last["rejected"]["spoofed_answer_key"] >= 10
    assert last["accepted_from"].get(junk.peer_id) == 1
    assert f"banned peer {junk.peer_id}" in node.log_text()
    assert f"dropped the connection to banned peer {junk.peer_id}" in node.log_text()
