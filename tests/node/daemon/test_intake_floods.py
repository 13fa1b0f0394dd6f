"""Issue #29, on a simulated clock with the real codec, verifier, inbox and peer score: a peer
that floods flat groups pays for the verifications it costs and is banned, an honest weak node
whose every group is flat is not; a flood of stale frames flushes no memory, so replays of an
honest author's messages are refused free of charge, never charged to it as `repeat`."""

from __future__ import annotations

import time

from sapo.node.core.exchange import GroupEncoder
from sapo.node.core.intake import CLOCK_SKEW_SECONDS, VERIFY_BURST, VERIFY_CPU_SECONDS, VERIFY_RATE
from sapo.node.study.nodes import peer_id_for
from sapo.protocol.peers.peer_guard import BAN_SCORE, PeerGuard
from sapo.protocol.toolkit.recent import RecentByAuthor
from sapo.protocol.wire.verify import SCORING_CPU_SECONDS
from sapo.sampling.inbox import Inbox
from sapo.training.problems.rewards import score_group
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs, reasoning_gym_version
from tests.support.receiving import Receiver, memory_of

START = 1_700_000_000.0
ME, HONEST, FLOODER = peer_id_for(0, 0), peer_id_for(0, 1), peer_id_for(0, 2)
GOSSIP_RATE = 50.0  # NetworkSettings.peer_message_rate: the most any peer may publish for long
PROBLEMS = TaskSampler(default_task_specs(["basic_arithmetic"]), 77, 0).sample(5000)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def node(clock: Clock, max_age: float = 600.0, seen_capacity: int = 65_536) -> tuple[Receiver, PeerGuard]:
    guard = PeerGuard(rate=GOSSIP_RATE, burst=100, ban_seconds=600, clock=clock)
    memory = memory_of(
        Inbox(10_000, 2**28, max_age), swarm="t", local_peer_id=ME, max_age_seconds=max_age, seen_capacity=seen_capacity
    )
    intake = Receiver(memory, penalize=lambda signer, reason: guard.penalize(signer.encode(), reason))
    return intake, guard


def encoder(peer: str, clock) -> GroupEncoder:
    return GroupEncoder(peer_id=peer, swarm="t", model_id="m", rg_version=reasoning_gym_version(), clock=clock)


def flat(index: int) -> QuestionGroup:
    return QuestionGroup(problem=PROBLEMS[index], completions=[""] * 4, rewards=[0.0] * 4)


def taught(index: int) -> QuestionGroup:
    problem = PROBLEMS[index]
    return QuestionGroup(
        problem=problem, completions=[f"<answer>{problem.answer}</answer>", "<answer>x</answer>"], rewards=[1.0, 0.0]
    )


def run(
    intake: Receiver, guard: PeerGuard, clock: Clock, seconds: float, senders: dict[str, tuple[float, object]]
) -> dict[str, float]:
    """Each sender publishes at its rate (groups a second) what its maker makes of a running
    index, through the gossip bucket then the intake; when each one was banned (or absent)."""
    banned: dict[str, float] = {}
    next_at = {peer: START for peer in senders}
    sent = dict.fromkeys(senders, 0)
    end = START + seconds
    while True:
        peer = min(next_at, key=next_at.get)
        if next_at[peer] >= end:
            return banned
        clock.now = next_at[peer]
        rate, make = senders[peer]
        sent[peer] += 1
        next_at[peer] = START + sent[peer] / rate
        if guard.admit(peer.encode(), sent[peer]) is None:
            intake.accept(encoder(peer, clock).frame(make(sent[peer] % len(PROBLEMS)), 1), peer, clock.now)
        if guard.is_banned(peer.encode()):
            banned.setdefault(peer, clock.now - START)


def test_a_flat_flooder_at_the_gossip_limit_is_banned_within_a_minute_an_honest_peer_never_refused():
    clock = Clock()
    intake, guard = node(clock)
    banned = run(intake, guard, clock, 60, {FLOODER: (GOSSIP_RATE, flat), HONEST: (5.0, taught)})
    assert banned.keys() == {FLOODER} and banned[FLOODER] < 30
    assert intake.counters.rejected["over_budget"] > 0
    assert intake.counters.accepted_from == {HONEST: 300}  # every honest group, all through the flood


def test_an_honest_weak_node_whose_every_group_is_flat_is_never_banned_at_its_rate():
    clock = Clock()
    intake, guard = node(clock)
    # 30 a second: an untrained tiny model on a fast CPU; its bursts are a round's groups at once
    banned = run(intake, guard, clock, 120, {HONEST: (30.0, flat)})
    assert not banned and guard.score(HONEST.encode()) > BAN_SCORE / 2
    assert intake.counters.rejected["no_signal"] == 3600 and not intake.counters.rejected["over_budget"]


def test_after_a_flood_of_stale_frames_replays_of_an_honest_authors_messages_cost_it_nothing():
    clock = Clock()
    intake, guard = node(clock, seen_capacity=4096)  # a small memory: a flood must not flush it all the same
    honest = encoder(HONEST, clock)
    frames = []
    for i in range(200):
        clock.now = START + i
        frames.append(honest.frame(taught(i), 1))
        assert intake.accept(frames[-1], HONEST, clock.now) is not None
    clock.now = START + 300
    old = encoder(FLOODER, lambda: START - 10_000)  # fresh messages, stamped long ago
    for i in range(3 * 4096):
        assert intake.accept(old.frame(flat(i % 1000), 1), FLOODER, clock.now) is None
    assert intake.counters.rejected["stale"] == 3 * 4096
    # Everyone may forward anyone's signed frames: within the age window they are duplicates...
    for frame in frames:
        assert intake.accept(frame, HONEST, clock.now) is None
    assert intake.counters.rejected["duplicate"] == 200 and not intake.counters.rejected["repeat"]
    # ... and past it, stale (or still remembered: duplicate); neither costs the author anything
    clock.now = START + 1000
    for frame in frames:
        assert intake.accept(frame, HONEST, clock.now) is None
    refused = intake.counters.rejected
    assert refused["stale"] - 3 * 4096 + refused["duplicate"] == 400 and not refused["repeat"]
    assert guard.score(HONEST.encode()) == 0.0


def test_one_authors_verified_junk_pushes_out_only_its_own_memories():
    clock = Clock()
    intake, guard = node(clock, seen_capacity=4096)
    honest, flooder = encoder(HONEST, clock), encoder(FLOODER, clock)
    frames = [honest.frame(taught(i), 1) for i in range(50)]
    for frame in frames:
        assert intake.accept(frame, HONEST, clock.now) is not None
    for i in range(5000):  # at its budget's rate, every one verified and accepted
        clock.now += 1.0 / VERIFY_RATE
        intake.accept(flooder.frame(taught(i % 4999 + 1), 1), FLOODER, clock.now)
    assert intake.counters.accepted_from[FLOODER] > 4096  # more than the whole memory holds
    for frame in frames:
        assert intake.accept(frame, HONEST, clock.now) is None
    assert intake.counters.rejected["duplicate"] == 50 and not intake.counters.rejected["repeat"]
    # the author itself re-stamping its own group is still a repeat
    assert intake.accept(honest.frame(taught(0), 1), HONEST, clock.now) is None
    assert intake.counters.rejected["repeat"] == 1


def test_the_memory_outlasts_the_age_window_at_the_budget_rate():
    intake, _ = node(Clock())
    per_author = intake.intake._contents.per_author
    assert per_author >= VERIFY_RATE * (600 + CLOCK_SKEW_SECONDS) + VERIFY_BURST


def test_recent_by_author_bounds_each_author_and_the_whole():
    memory: RecentByAuthor[int] = RecentByAuthor(per_author=10, total=25, ttl=100)
    for i in range(5):
        memory.put("honest", i, i, stamp=0, now=0)
    for i in range(1000):
        memory.put("flooder", i, i, stamp=0, now=0)
    assert memory.count("flooder") == 10 and all(memory.contains("honest", i) for i in range(5))
    for author in "abc":
        for i in range(10):
            memory.put(author, i, i, stamp=0, now=0)
    assert len(memory) == 25 and all(memory.contains("honest", i) for i in range(5))  # the largest paid
    memory.put("honest", 99, 99, stamp=150, now=150)  # its older entries are past the ttl
    assert memory.count("honest") == 1 and memory.get("honest", 99) == 99


def test_replayed_sequence_numbers_are_never_charged_to_their_author():
    clock = Clock()
    guard = PeerGuard(rate=GOSSIP_RATE, burst=100, ban_seconds=600, clock=clock)
    for seqno in range(1, 101):
        assert guard.admit(b"honest", seqno) is None
    verdicts = [guard.admit(b"honest", seqno % 100 + 1) for seqno in range(100_000)]  # someone replays them all
    assert verdicts.count(None) == 100 and verdicts.count("replayed") == 100_000 - 100
    assert guard.score(b"honest") == 0.0 and not guard.is_banned(b"honest")
    clock.now += 2.0  # its bucket refills; its own next publish goes through
    assert guard.admit(b"honest", 101) is None


def burn(seconds: float) -> None:
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


def test_a_group_that_costs_more_cpu_to_score_than_its_budget_is_refused_and_charged_in_proportion():
    """Issue #38: whatever a future verifier costs, a group over SCORING_CPU_SECONDS is refused
    (`too_costly`), and every group's scoring CPU is charged to its author's verification budget,
    so expensive groups run it out faster than cheap ones. The verifier here is honest scoring
    made slow (burning CPU as a quadratic scorer did), on the real codec and intake."""
    cost = {"seconds": 0.0}

    def slow_verifier(problem, completions):
        burn(cost["seconds"])
        return score_group(problem, completions)

    clock = Clock()
    intake, guard = node(clock)
    intake.intake.verifier = slow_verifier
    sender = encoder(FLOODER, clock)
    cost["seconds"] = SCORING_CPU_SECONDS * 1.5
    assert intake.accept(sender.frame(taught(0), 1), FLOODER, clock.now) is None
    assert intake.counters.rejected["too_costly"] == 1
    assert guard.score(FLOODER.encode()) <= -10.0  # PENALTIES["too_costly"]
    # that group cost 30 verifications (150 ms at VERIFY_CPU_SECONDS = 5 ms); groups of 95 ms, under
    # the group budget, cost 19 each: the 70 left last 4 of them, the next 5 are over budget
    cost["seconds"] = 19 * VERIFY_CPU_SECONDS
    accepted = sum(intake.accept(sender.frame(taught(i), 1), FLOODER, clock.now) is not None for i in range(1, 10))
    assert accepted == 4 and intake.counters.rejected["over_budget"] == 5
    # an author whose groups score cheaply gets its whole burst
    honest = encoder(HONEST, clock)
    cost["seconds"] = 0.0
    assert sum(intake.accept(honest.frame(taught(i), 1), HONEST, clock.now) is not None for i in range(10, 60)) == 50
