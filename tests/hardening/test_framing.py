"""Issue #29: no peer can get an honest one charged for repeating itself. After a flood of stale
frames (fresh messages stamped long ago, free to send), the honest author's earlier frames coming
back are refused free of charge (`duplicate`), never charged to it as `repeat`: the intake's
memories are per author, and nothing that fails the envelope enters them. And a node resumed from
a checkpoint, which redoes the rounds after it, is charged nothing by its peers: it samples new
completions. Over real libp2p, to running nodes.

The honest frames come back here re-published by their author (the same bytes under a new
libp2p envelope), which is what the intake sees when a peer forwards them after the libp2p seen
caches forget them (120 s; forwarded replays of old sequence numbers are also never charged to
their author at the gossip layer: test_intake_floods)."""

from __future__ import annotations

import signal

import trio

from sapo.node.daemon.status import status_from_url
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs
from tests.support.groups import honest_group
from tests.support.peer import Peer
from tests.support.processes import PLUMBING, TOPIC_PATH, NodeProcess, page_url, wait_rounds

HONEST_GROUPS = 10
STALE = 400
CHECKPOINT_EVERY = 3


async def test_after_a_flood_of_stale_frames_replays_of_an_honest_authors_groups_cost_it_nothing(tmp_path, nodes):
    node = NodeProcess(tmp_path / "n", [*PLUMBING, *TOPIC_PATH, "--metrics-port", "0"])
    nodes.append(node)
    url = page_url(node)
    honest, flooder = Peer(0x71, node.address, model_id="honest"), Peer(0x72, node.address, model_id="stale")
    problems = TaskSampler(default_task_specs(["basic_arithmetic"]), 93, 0).sample(STALE)
    flooder.encoder.clock = lambda: 1_000_000.0  # fresh messages, stamped in 1970
    stale = [
        flooder.encoder.frame(QuestionGroup(problem=p, completions=["a", "b"], rewards=[1.0, 0.0]), 1) for p in problems
    ]
    with trio.fail_after(150):
        async with trio.open_nursery() as nursery:
            await honest.join(nursery, node)
            await flooder.join(nursery, node)
            originals = [honest.encoder.frame(honest_group(i), 1) for i in range(HONEST_GROUPS)]
            for frame in originals:
                assert await honest.service.publish(frame)
            for i, frame in enumerate(stale):
                await flooder.service.publish(frame)
                if i % 40 == 39:
                    await trio.sleep(1)  # under the gossip limit: all of it reaches the intake
            for _ in range(2):
                for frame in originals:  # the same frames again
                    assert await honest.service.publish(frame)
                await trio.sleep(0.5)
            while True:
                rows = node.metrics()
                last = rows[-1] if rows else {"rejected": {}, "accepted_from": {}}
                if (
                    last["rejected"].get("stale", 0) >= STALE
                    and last["rejected"].get("duplicate", 0) >= 2 * HONEST_GROUPS
                ):
                    break
                assert node.alive(), node.log_text()[-3000:]
                await trio.sleep(0.3)
            scores = {p.peer_id: p.score for p in status_from_url(url).peers}
            nursery.cancel_scope.cancel()
    assert last["accepted_from"] == {honest.peer_id: HONEST_GROUPS}
    assert "repeat" not in last["rejected"]
    assert not last["transport"].get("peers_banned")
    assert scores[honest.peer_id] == 0  # charged nothing


async def test_a_node_resumed_from_a_checkpoint_is_charged_nothing_by_its_peers(tmp_path, nodes):
    receiver = NodeProcess(tmp_path / "r", [*PLUMBING])  # augments: takes the untrained model's flat groups
    nodes.append(receiver)
    args = [*PLUMBING, "--checkpoint-every", str(CHECKPOINT_EVERY), "--peers", receiver.address]
    sender = NodeProcess(tmp_path / "s", args)
    nodes.append(sender)
    with trio.fail_after(240):
        # past a checkpoint (round 3), and its groups of the rounds after it in the receiver's inbox
        while True:
            if sender.last_round() >= 4 and _accepted(receiver, sender.peer_id) >= 2 * 4:
                # Frozen, it cannot finish another round (or checkpoint) while we read how far it
                # got. Killed just after a checkpoint's round, it would redo nothing: wait one more.
                sender.proc.send_signal(signal.SIGSTOP)
                published = sender.last_round()
                if published % CHECKPOINT_EVERY:
                    break
                sender.proc.send_signal(signal.SIGCONT)
            assert sender.alive() and receiver.alive(), sender.log_text()[-3000:]
            await trio.sleep(0.2)
        sender.stop(signal.SIGKILL)  # no checkpoint on the way out
        before = _accepted(receiver, sender.peer_id)
        again = NodeProcess(tmp_path / "s", args)
        nodes.append(again)
        assert again.peer_id == sender.peer_id
        while "resumed from" not in again.log_text():
            assert again.alive(), again.log_text()[-3000:]
            await trio.sleep(0.2)
        resumed_at = int(again.log_text().rsplit("resumed from", 1)[1].split("at round ", 1)[1].split()[0])
        assert resumed_at < published  # it redoes rounds it had published
        while _accepted(receiver, sender.peer_id) < before + 2 * (published - resumed_at + 1):
            assert again.alive() and receiver.alive(), again.log_text()[-3000:]
            await trio.sleep(0.3)
    wait_rounds(receiver, 1, 60)
    last = receiver.metrics()[-1]
    assert "repeat" not in last["rejected"]
    assert not last["transport"].get("peers_banned")


def _accepted(node: NodeProcess, peer: str) -> int:
    rows = node.metrics()
    return rows[-1]["accepted_from"].get(peer, 0) if rows else 0
