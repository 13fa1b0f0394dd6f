"""A peer that republishes one of its own groups with only `created_at` changed gets it in once:
the intake deduplicates on content (the author, the problem, the completions), not on the frame.
Over real libp2p, from a real signed peer, to a running node."""

from __future__ import annotations

import trio

from tests.support.groups import honest_group
from tests.support.peer import Peer
from tests.support.processes import PLUMBING, TOPIC_PATH, NodeProcess

COPIES = 20


async def test_a_re_stamped_replay_is_trained_on_once_and_counted_as_a_repeat(tmp_path, nodes):
    node = NodeProcess(tmp_path / "n", [*PLUMBING, *TOPIC_PATH])
    nodes.append(node)
    peer = Peer(0x41, node.address, model_id="replayer")
    group = honest_group()
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await peer.join(nursery, node)
            frames = set()
            for _copy in range(COPIES):
                # the encoder stamps created_at from the clock: each copy is a different frame
                frame = peer.encoder.frame(group, 1)
                frames.add(frame)
                assert await peer.service.publish(frame)
                await trio.sleep(0.25)
            assert len(frames) == COPIES
            while True:
                rows = node.metrics()
                last = rows[-1] if rows else {}
                if (
                    last.get("accepted_from", {}).get(peer.peer_id, 0) + last.get("rejected", {}).get("repeat", 0)
                    >= COPIES
                ):
                    break
                assert node.alive(), node.log_text()[-3000:]
                await trio.sleep(0.3)
            target = last["round"] + 2  # time for the one accepted copy to be trained on
            while node.last_round() < target:
                assert node.alive(), node.log_text()[-3000:]
                await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
    rows = node.metrics()
    assert rows[-1]["accepted_from"] == {peer.peer_id: 1}
    assert rows[-1]["rejected"].get("repeat") == COPIES - 1
    assert "duplicate" not in rows[-1]["rejected"]  # every frame was new; only the content repeated
    assert sum(r["external_groups"] for r in rows) == 1  # trained on once
    assert not rows[-1]["transport"].get("peers_banned")  # charged, but 19 repeats are not a ban
