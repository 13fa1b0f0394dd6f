"""A peer that sends well-formed groups whose completions are all empty (the documented format,
nothing in it a decoder can object to) gets none of them into the inbox: each is re-scored on
arrival, all score alike, and is refused and counted as `no_signal`, while an honest peer's groups
keep getting in. Over real libp2p, from real signed peers, to a running node that does not augment."""

from __future__ import annotations

import trio

from sapo.node.daemon.status import status_from_url
from sapo.training.problems.rollouts import QuestionGroup
from tests.support.groups import honest_group
from tests.support.peer import Peer
from tests.support.processes import NO_AUGMENT, TOPIC_PATH, NodeProcess, page_url

EMPTY_GROUPS = 30


async def test_groups_of_empty_completions_take_no_inbox_room_and_honest_ones_still_do(tmp_path, nodes):
    node = NodeProcess(tmp_path / "n", [*NO_AUGMENT, *TOPIC_PATH, "--metrics-port", "0"])
    nodes.append(node)
    url = page_url(node)
    empty, honest = Peer(0x51, node.address, model_id="empty"), Peer(0x52, node.address, model_id="honest")
    with trio.fail_after(150):
        async with trio.open_nursery() as nursery:
            await empty.join(nursery, node)
            await honest.join(nursery, node)
            for i in range(EMPTY_GROUPS):  # distinct questions: none is a repeat of another
                flat = QuestionGroup(problem=honest_group(i).problem, completions=[""] * 4, rewards=[1.0] * 4)
                assert await empty.service.publish(empty.encoder.frame(flat, 1))
                await honest.publish_honest()
                await trio.sleep(0.1)
            while True:
                rows = node.metrics()
                last = rows[-1] if rows else {"rejected": {}, "accepted_from": {}}
                if (
                    last["rejected"].get("no_signal", 0) >= EMPTY_GROUPS
                    and last["accepted_from"].get(honest.peer_id, 0) >= honest.published
                ):
                    break
                assert node.alive(), node.log_text()[-3000:]
                await trio.sleep(0.3)
            peers = {p.peer_id: p for p in status_from_url(url).peers}
            nursery.cancel_scope.cancel()

    assert last["rejected"]["no_signal"] == EMPTY_GROUPS  # each one counted
    assert empty.peer_id not in last["accepted_from"]  # none stored
    assert last["accepted_from"][honest.peer_id] == honest.published == EMPTY_GROUPS
    assert not last["transport"].get("peers_banned")
    assert peers[empty.peer_id].score > -1  # charged lightly: 0.02 a group, regained at 1 point a second
    assert peers[honest.peer_id].score == 0
