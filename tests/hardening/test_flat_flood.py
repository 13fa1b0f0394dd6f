"""Issue #29: a peer sending flat groups (well formed, distinct, each one regenerated and re-scored
by the receiver, none with anything to teach) at its maximum rate is banned within 60 s, and an
honest peer's groups keep being accepted throughout. Over real libp2p, from real signed peers, to
a running node that does not augment (so it refuses flat groups as `no_signal`).

The flooder publishes at the gossip limit (NetworkSettings.peer_message_rate, 50/s) with its own
client's spam limit off: faster, the gossip bucket bans it by itself (test_peer_guard). At 50/s
it is only ever refused by the intake: by its budget of verifications (40/s), past which each
group is refused unverified (`over_budget`) and charged.

Issue #38: the same flood, each group's completions 16 KB propositional_logic answers (the
formula that cost 0.3.0's scorer 7.35 s of CPU each and scored 1.0). Over its answer cap, each now
scores 0 unparsed: the node keeps up, and the flooder is banned as any flooder is."""

from __future__ import annotations

import pytest
import trio

from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs
from tests.support.peer import Peer
from tests.support.processes import NO_AUGMENT, TOPIC_PATH, NodeProcess

RATE = 50  # a second: the gossip limit
BAN_WITHIN = 60.0


# A 16 KB answer (the codec's limit per completion) that reasoning-gym 0.1.25's scorer parses in quadratic time.
COSTLY_FORMULA = " ∨ ".join(["(P ∧ Q)"] * 1700)[: 16_384 - len("<answer></answer>")]


def flat_groups(count: int) -> list[QuestionGroup]:
    problems = TaskSampler(default_task_specs(["basic_arithmetic"]), 91, 0).sample(count)
    return [QuestionGroup(problem=p, completions=[""] * 4, rewards=[0.0] * 4) for p in problems]


def costly_groups(count: int) -> list[QuestionGroup]:
    problems = TaskSampler(default_task_specs(["propositional_logic"]), 92, 0).sample(count)
    texts = [f"<answer>{COSTLY_FORMULA}</answer>"] * 8
    return [QuestionGroup(problem=p, completions=texts, rewards=[1.0] * 8) for p in problems]


@pytest.mark.parametrize("groups", [flat_groups, costly_groups], ids=["flat", "16KB-propositional-logic"])
async def test_a_flooder_at_its_maximum_rate_is_banned_within_a_minute_and_honest_groups_keep_coming_in(
    tmp_path, nodes, groups
):
    node = NodeProcess(tmp_path / "n", [*NO_AUGMENT, *TOPIC_PATH])
    nodes.append(node)
    flooder, honest = Peer(0x61, node.address, model_id="flat"), Peer(0x62, node.address, model_id="honest")
    frames = [flooder.encoder.frame(group, 1) for group in groups(int(RATE * BAN_WITHIN) + 100)]
    with trio.fail_after(BAN_WITHIN + 90):
        async with trio.open_nursery() as nursery:
            await flooder.join(nursery, node)
            await honest.join(nursery, node)
            flooder.service.pubsub.router.spam_protection_enabled = False  # a hostile client ignores its own
            started = trio.current_time()
            sent = 0
            banned_after = None
            while banned_after is None and trio.current_time() - started < BAN_WITHIN:
                for _ in range(RATE // 10):  # encoded just before: well inside the age window
                    await flooder.service.publish(frames[sent % len(frames)])
                    sent += 1
                if sent % RATE == 0:
                    await honest.publish_honest()  # one honest group a second, through the flood
                await trio.sleep(0.1)
                if node.peer_id not in flooder.service.connected_peers():
                    banned_after = trio.current_time() - started
            during = honest.published
            for _ in range(5):  # and after it
                await honest.publish_honest()
                await trio.sleep(0.5)
            while True:
                rows = node.metrics()
                last = rows[-1] if rows else {"rejected": {}, "accepted_from": {}, "transport": {}}
                if last["accepted_from"].get(honest.peer_id, 0) >= honest.published:
                    break
                assert node.alive(), node.log_text()[-3000:]
                await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
    print(
        f"\nflat flooder: {sent} sent, cut off after {banned_after} s; honest: {during} published during the flood, "
        f"{honest.published} in all, {last['accepted_from'].get(honest.peer_id)} accepted; refused {last['rejected']}"
    )
    assert banned_after is not None and banned_after < BAN_WITHIN
    assert f"banned peer {flooder.peer_id}" in node.log_text()
    assert last["transport"].get("peers_banned") == 1  # the flooder alone
    assert last["rejected"].get("over_budget", 0) > 0
    assert flooder.peer_id not in last["accepted_from"]
    assert last["accepted_from"][honest.peer_id] == honest.published  # every honest group, during the flood and after
    assert during >= 5
