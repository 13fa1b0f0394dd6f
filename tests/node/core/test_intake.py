"""The intake with the real codec, verifier and inbox: groups that cannot teach this node are
refused (and charged), and a peer's shared log-probs ride into the inbox with the group they name,
never with another author's."""

from __future__ import annotations

import json

from sapo.node.core.exchange import GroupEncoder
from sapo.node.study.nodes import peer_id_for
from sapo.training.problems.rollouts import Behavior, QuestionGroup
from sapo.training.problems.tasks import reasoning_gym_version
from tests.support.groups import honest_group
from tests.support.intake import intake

NOW = 1_700_000_000.0
ALICE, MALLORY = peer_id_for(0, 1), peer_id_for(0, 2)


def encoder(peer: str, share: bool = False) -> GroupEncoder:
    return GroupEncoder(
        peer_id=peer,
        swarm="t",
        model_id="m",
        rg_version=reasoning_gym_version(),
        share_logprobs=share,
        clock=lambda: NOW,
    )


def flat(index: int) -> QuestionGroup:
    return QuestionGroup(problem=honest_group(index).problem, completions=[""] * 4, rewards=[1.0] * 4)


def test_a_group_whose_completions_all_score_alike_is_refused_counted_and_charged():
    receiver, charged = intake()
    frames = [encoder(ALICE).frame(flat(i), 1) for i in range(5)]
    assert [receiver.accept(frame, ALICE, NOW) for frame in frames] == [None] * 5
    assert receiver.counters.rejected["no_signal"] == 5 and len(receiver.inbox) == 0
    assert charged == [(ALICE, "no_signal")] * 5
    right = QuestionGroup(
        problem=honest_group(6).problem,
        completions=[f"<answer>{honest_group(6).problem.answer}</answer>"] * 2,
        rewards=[0.0, 0.0],
    )  # all correct: nothing to learn either, whatever the sender claims
    assert receiver.accept(encoder(ALICE).frame(right, 1), ALICE, NOW) is None
    assert receiver.accept(encoder(ALICE).frame(honest_group(7), 1), ALICE, NOW) is not None
    assert len(receiver.inbox) == 1 and receiver.counters.accepted_from == {ALICE: 1}


def test_a_node_that_augments_keeps_them():
    receiver, charged = intake(keep=True)
    assert receiver.accept(encoder(ALICE).frame(flat(0), 1), ALICE, NOW) is not None
    assert len(receiver.inbox) == 1 and not charged


def test_shared_log_probs_join_their_group_by_digest_and_author():
    receiver, _ = intake()
    behavior = Behavior(tokenizer="abc", temperature=1.0, token_logprobs=[[-0.5, -0.25], [-1.0]])
    groups = [honest_group(i).model_copy(update={"behavior": behavior}) for i in range(3)]
    alice = encoder(ALICE, share=True).frames(groups, 1)
    assert len(alice.logprobs) == 1  # one message for the round's three groups
    # Mallory re-signs Alice's log-probs as her own: they name Alice's groups, but are not Alice's
    forged = encoder(MALLORY, share=True).frames(groups, 1)
    assert receiver.accept_logprobs(forged.logprobs[0], MALLORY, NOW) == 3
    assert receiver.accept(alice.groups[0], ALICE, NOW).behavior is None
    assert receiver.accept_logprobs(alice.logprobs[0], ALICE, NOW) == 3
    assert receiver.accept(alice.groups[1], ALICE, NOW).behavior == behavior
    assert receiver.accept(alice.groups[2], ALICE, NOW).behavior == behavior
    assert receiver.counters.logprobs == {"received": 2, "late": 1, "joined": 2}  # group 0 was in already
    # signed by one peer, naming another as the sender: refused and charged like a group
    assert receiver.accept_logprobs(alice.logprobs[0], MALLORY, NOW) == 0
    assert receiver.counters.rejected["sender_mismatch"] == 1


def test_log_probs_are_split_into_messages_of_bounded_size():
    behavior = Behavior(tokenizer="abc", temperature=1.0, token_logprobs=[[-0.123456789] * 2000, [-1.0] * 2000])
    # completions long enough for 2000 tokens each (a token is at least a byte)
    long = [honest_group(i) for i in range(8)]
    groups = [
        g.model_copy(update={"behavior": behavior, "completions": [c + " " * 2000 for c in g.completions]})
        for g in long
    ]
    out = encoder(ALICE, share=True).frames(groups, 1)
    assert len(out.logprobs) > 1 and all(len(frame) < 64 * 1024 for frame in out.logprobs)
    receiver, _ = intake()
    assert sum(receiver.accept_logprobs(frame, ALICE, NOW) for frame in out.logprobs) == 8
    assert all(receiver.accept(frame, ALICE, NOW).behavior == behavior for frame in out.groups)


def test_its_memories_survive_a_study_checkpoint():
    # a study's run checkpoint keeps the intake's memories: the content an author had verified is
    # still a repeat after the restore, and waiting log-probs still join their group
    receiver, _ = intake()
    behavior = Behavior(tokenizer="abc", temperature=1.0, token_logprobs=[[-0.5, -0.25], [-1.0]])
    groups = [honest_group(i).model_copy(update={"behavior": behavior}) for i in range(2)]
    alice = encoder(ALICE, share=True).frames(groups, 1)
    assert receiver.accept_logprobs(alice.logprobs[0], ALICE, NOW) == 2
    assert receiver.accept(alice.groups[0], ALICE, NOW) is not None
    saved = json.loads(json.dumps(receiver.to_json()))
    restored, charged = intake()
    restored.restore(saved)
    assert restored.to_json() == receiver.to_json()
    assert restored.accept(alice.groups[0], ALICE, NOW + 1) is None  # the same frame: a replay
    again = GroupEncoder(
        peer_id=ALICE, swarm="t", model_id="m", rg_version=reasoning_gym_version(), clock=lambda: NOW + 1
    )
    assert restored.accept(again.frame(groups[0], 2), ALICE, NOW + 1) is None  # re-stamped: a repeat
    assert charged == [(ALICE, "duplicate"), (ALICE, "repeat")]
    assert restored.accept(alice.groups[1], ALICE, NOW + 1).behavior == behavior


def test_log_probs_cannot_outgrow_their_completions_nor_the_inbox_cap():
    """A row of log-probs longer than its completion's bytes is padding (a sampled token is at
    least a byte): refused on the wire (release 0.2.0's inline field) and not joined when shared;
    what is joined counts in the inbox's byte cap."""
    from sapo.protocol.wire.codec import DecodeLimits, decode, encode
    from sapo.protocol.wire.messages import Rejected, to_wire
    from sapo.sampling.inbox import BYTES_PER_LOGPROB, group_size_bytes

    group = honest_group(3)
    fat = Behavior(tokenizer="abc", temperature=1.0, token_logprobs=[[-1.0] * 4000 for _ in group.completions])
    wire = to_wire(
        group, sender=ALICE, swarm="t", sender_round=1, model_id="m", created_at=NOW, reasoning_gym_version="x"
    )
    frame = encode(wire.model_copy(update={"behavior": fat}), compress=True)
    assert len(frame) < 2000  # cheap to send: zlib packs the padding
    try:
        decode(frame, DecodeLimits())
        raise AssertionError("decoded")
    except Rejected as refused:
        assert "behavior row of 4000 tokens" in refused.detail
    receiver, _ = intake()
    shared = encoder(ALICE, share=True).frames([group.model_copy(update={"behavior": fat})], 1)
    receiver.accept_logprobs(shared.logprobs[0], ALICE, NOW)
    kept = receiver.accept(shared.groups[0], ALICE, NOW)
    assert kept is not None and kept.behavior is None and receiver.counters.logprobs["mismatched"] == 1
    fits = Behavior(tokenizer="abc", temperature=1.0, token_logprobs=[[-1.0] * 3 for _ in group.completions])
    with_rows = group.model_copy(update={"behavior": fits})
    assert group_size_bytes(with_rows) == group_size_bytes(group) + BYTES_PER_LOGPROB * 3 * len(group.completions)
