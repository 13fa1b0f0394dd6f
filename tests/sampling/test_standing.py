"""Authors' standing: fresh identities, however many, cannot take a node's inbox or its training
from authors who earned their place over time. Frames go through the real codec and intake into
the inbox a node's settings build; the draw is the node's own (`choose_from_inbox`), and the rows
are the round's own pure step (`training_set`)."""

from __future__ import annotations

import json
import random

import pytest

from sapo.node.core.counters import NodeCounters
from sapo.node.core.exchange import GroupEncoder
from sapo.node.core.intake import node_intake
from sapo.node.core.memory import NodeMemory
from sapo.node.core.node import choose_from_inbox, node_inbox
from sapo.node.core.settings import load_settings
from sapo.node.study.nodes import peer_id_for
from sapo.sampling.standing import (
    DROP_LIMIT,
    IDLE_SECONDS,
    MAX_AUTHORS,
    OLDER_RELEASES_PLACE,
    PUSHED,
    RECENT_SHARE,
    SCREEN_WEIGHT,
    Provenance,
    Standing,
)
from sapo.sampling.strategies import SamplerState
from sapo.sampling.training_set import training_set
from sapo.training.problems.rewards import score_group
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs, reasoning_gym_version
from tests.support.receiving import Receiver, memory_for

T0 = 1_700_000_000.0
ME = peer_id_for(9, 0)
HONEST = [peer_id_for(9, k) for k in range(1, 5)]
FRESH = [peer_id_for(9, k, "sybil") for k in range(4)]


def groups(count: int, seed: int) -> list[QuestionGroup]:
    """Valid groups with signal: one right completion, one wrong, on distinct questions."""
    out = []
    for problem in TaskSampler(default_task_specs(["basic_arithmetic"]), seed, seed).sample(count):
        texts = [f"<answer>{problem.answer}</answer>", "<answer>x</answer>"]
        out.append(QuestionGroup(problem=problem, completions=texts, rewards=score_group(problem, texts)))
    return out


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> float:
        return self.now


def test_fresh_keys_cannot_push_out_established_groups_or_take_the_training():
    # the node's defaults, but groups stay eligible for the test's whole half hour
    settings = load_settings({"model": "tiny", "tasks": ["basic_arithmetic"], "inbox_max_age_seconds": 3600})
    clock = Clock()
    inbox = node_inbox(settings)
    counters = NodeCounters()
    intake = Receiver(
        NodeMemory(
            inbox,
            node_intake(settings, counters, peer_id=ME, rg_version=reasoning_gym_version(), verifier=score_group),
            counters,
        )
    )
    encoders = {
        peer: GroupEncoder(
            peer_id=peer, swarm=settings.network.swarm, model_id="m", rg_version=reasoning_gym_version(), clock=clock
        )
        for peer in HONEST + FRESH
    }
    # four honest authors, one group every 30 s each for 25 minutes: 200 groups, full standing
    # (clocks started more than two ramps ago: not among the recent authors)
    honest = groups(200, seed=1)
    for i, group in enumerate(honest):
        clock.now = T0 + 30 * (i // 4)
        assert intake.accept(encoders[HONEST[i % 4]].frame(group, i), HONEST[i % 4], clock.now) is not None
    clock.now = T0 + 1500
    assert len(inbox) == 200 and all(inbox.standing.of(peer, clock.now) == 1.0 for peer in HONEST)
    # four fresh keys, 128 valid groups each (the most one author may hold), within a few seconds
    sybil = groups(512, seed=2)
    for i, group in enumerate(sybil):
        clock.now = T0 + 1510 + i / 100
        intake.accept(encoders[FRESH[i % 4]].frame(group, i), FRESH[i % 4], clock.now)
    held = inbox.newest_first(clock.now)
    assert intake.counters.accepted == 712  # every group was valid: none was refused, none charged
    kept = sum(1 for g in held if g.origin in HONEST)
    assert kept >= 0.9 * 200, f"only {kept} of 200 honest groups stayed"
    assert len(inbox) == settings.sampling.inbox_max_groups  # full: the fresh keys churned their own groups
    # the next 10 rounds, J = 4 each, as the node draws and trains them
    rng, sampler, fresh_rows, rows = random.Random(0), SamplerState(), 0, 0
    for _ in range(10):
        chosen, sampler = choose_from_inbox(
            inbox, settings.external_use, settings.sampling.external, rng, sampler, clock.now
        )
        inbox.take(chosen)
        trained = training_set([], chosen, settings.external_use, "t").rows
        rows += len(trained.rows)
        fresh_rows += sum(1 for row in trained.rows if chosen_origin(chosen, trained, row) in FRESH)
    assert rows == 40  # one winning row per group
    assert fresh_rows / rows <= 0.10, f"fresh keys had {fresh_rows} of {rows} rows"


def chosen_origin(chosen, trained, row) -> str:
    problem = trained.problems[row.question]
    return next(g.origin for g in chosen if g.problem == problem)


def test_without_standing_the_same_flood_takes_the_inbox():
    """The control: what the node did before (--standing off)."""
    settings = load_settings(
        {"model": "tiny", "tasks": ["basic_arithmetic"], "inbox_max_age_seconds": 3600, "standing": "off"}
    )
    inbox = node_inbox(settings)
    for i, group in enumerate(groups(200, seed=1)):
        inbox.add(group.model_copy(update={"origin": HONEST[i % 4]}), T0 + 15 * (i // 4))
    for i, group in enumerate(groups(512, seed=2)):
        inbox.add(group.model_copy(update={"origin": FRESH[i % 4]}), T0 + 760)
    assert sum(1 for g in inbox.newest_first(T0 + 760) if g.origin in HONEST) == 0


def test_standing_follows_time_since_the_first_asked_group_however_often_drawn():
    standing = Standing(ramp_seconds=600, newcomer_share=0.1)
    for minute in range(60):  # a group a minute, as a pusher would send
        standing.credit("every-minute", T0 + 60 * minute)
        standing.credit("pusher", T0 + 60 * minute, PUSHED)  # never asked for: earns nothing
    standing.credit("hourly", T0)  # drawn once, then again an hour later
    assert standing.of("hourly", T0 + 300) == standing.of("every-minute", T0 + 300) == 0.5
    assert standing.of("hourly", T0 + 600) == standing.of("every-minute", T0 + 600) == 1.0
    assert standing.of("pusher", T0 + 3600) == standing.of("stranger", T0 + 3600) == 0.0
    assert "pusher" not in set(standing._table)  # nothing is kept of an author that earned nothing
    # a week without a group that earned: its clock starts again
    assert standing.of("hourly", T0 + IDLE_SECONDS + 1) == 0.0
    standing.credit("hourly", T0 + IDLE_SECONDS + 1)
    assert standing.of("hourly", T0 + IDLE_SECONDS + 301) == 0.5


def test_what_the_screen_drops_costs_its_author_in_proportion():
    standing = Standing(ramp_seconds=600, newcomer_share=0.1)
    for author in ("honest", "prober", "refused"):
        standing.credit(author, T0)
    now = T0 + 3600
    standing.screened("honest", 0.0)
    standing.screened("honest", 0.25)  # one stray completion of four winners
    standing.screened("prober", 0.5)
    standing.screened("refused", 1.0)
    assert standing.of("honest", now) == pytest.approx(1 - SCREEN_WEIGHT * 0.25 / DROP_LIMIT)
    assert standing.of("prober", now) == pytest.approx(1 - SCREEN_WEIGHT * 0.5 / DROP_LIMIT)
    assert standing.of("refused", now) == pytest.approx(0.5)  # one refused group: half its standing
    for _ in range(7):  # regained over its next clean groups
        standing.screened("refused", 0.0)
    assert standing.of("refused", now) > 0.89


def test_one_clean_winner_cannot_launder_poisoned_ones_past_ten_groups():
    """Must show 3, in standing's terms: an established author whose every group carries one
    clean winner and poisoned others (at least half of its winners dropped) weighs what a fresh
    key weighs within 10 such groups. tests/training/test_typicality.py shows the same through a
    node's real screen."""
    standing = Standing(ramp_seconds=600, newcomer_share=0.1)
    standing.credit("mallory", T0)
    now = T0 + 3600
    assert standing.of("mallory", now) == 1.0
    fallen = None
    for n in range(1, 11):
        standing.screened("mallory", 0.5)  # 1 clean, 1 poisoned: the least that is still "poisoned others"
        weights = standing.weights(["mallory", "fresh", "honest"], now)
        if weights["mallory"] == pytest.approx(weights["fresh"]):
            fallen = n
            break
    assert fallen is not None and fallen <= 10, "still above a newcomer after 10 groups"
    assert standing.of("mallory", now) == 0.0


def test_newcomers_share_one_budget_however_many_they_are():
    standing = Standing(ramp_seconds=600, newcomer_share=0.1)
    standing.credit("old", T0, Provenance(place="ip4:203.0"))
    now = T0 + 1300
    for k in range(1000):
        standing.credit(f"new{k}", now, Provenance(place=f"ip4:{k}"))
    for n in (1, 10, 1000):
        weights = standing.weights(["old", *(f"new{k}" for k in range(n))], now)
        assert weights["old"] == 1.0
        assert abs(sum(w for a, w in weights.items() if a != "old") - 0.1) < 1e-9
    alike = standing.weights([f"new{k}" for k in range(5)], now)  # a swarm starting together: all alike
    assert len(set(alike.values())) == 1


def test_many_keys_established_together_hold_a_bounded_share():
    standing = Standing(ramp_seconds=600, newcomer_share=0.1)
    for k in range(8):
        standing.credit(f"old{k}", T0, Provenance(place=f"203.{k}.0.0/16"))
    for k in range(100):  # patient keys, each in a /16 of its own, established 10 minutes ago
        standing.credit(f"patient{k}", T0 + 1800, Provenance(place=f"198.{k}.0.0/16"))
    now = T0 + 2400 + 300
    assert standing.of("patient0", now) == 1.0
    weights = standing.weights([*(f"old{k}" for k in range(8)), *(f"patient{k}" for k in range(100))], now)
    old = sum(weights[f"old{k}"] for k in range(8))
    assert old == 8.0
    assert sum(weights[f"patient{k}"] for k in range(100)) == pytest.approx(RECENT_SHARE * old)
    # one more ramp later they are established like anyone
    later = standing.weights(["old0", "patient0"], now + 600)
    assert later["old0"] == later["patient0"] == 1.0


ESTABLISHED = [f"honest-{k}" for k in range(31)]  # issue #42's real run: 32 nodes, 31 authors each


def established_swarm(now: float) -> Standing:
    """31 authors, each in a /16 of its own, whose clocks started an hour before `now`."""
    standing = Standing(ramp_seconds=600, newcomer_share=0.1)
    for k, author in enumerate(ESTABLISHED):
        standing.credit(author, now - 3600, Provenance(place=f"203.{k}.0.0/16"))
    return standing


def honest_share(weights: dict[str, float]) -> float:
    return sum(w for a, w in weights.items() if a in ESTABLISHED) / sum(weights.values())


def test_keys_posing_as_older_releases_weigh_one_author_together():
    """Issue #42's must-show 1 against 20 pushers: keys that pose as older releases are credited
    from their first push, by right (the exchange places them in OLDER_RELEASES_PLACE), and stand
    at 1.0 as honest authors do; together they weigh what one of them weighs."""
    now = T0 + 3600
    standing = established_swarm(now)
    pushers = [f"pusher-{k}" for k in range(20)]
    for author in pushers:
        for minute in range(60):  # a group a minute on the topic
            standing.credit(author, T0 + 60 * minute, Provenance(place=OLDER_RELEASES_PLACE))
    assert all(standing.of(author, now) == 1.0 for author in pushers)
    weights = standing.weights(ESTABLISHED + pushers, now)
    assert sum(weights[a] for a in pushers) == pytest.approx(1.0)
    assert honest_share(weights) >= 0.8  # 31 / 32
    assert all(weights[a] == 1.0 for a in ESTABLISHED)


def test_keys_that_arrived_within_the_last_ten_minutes_hold_at_most_a_sixth():
    """Issue #42's must-show 1 against 20 late keys: their clocks started 0-10 minutes ago (they
    stand at 0-1), and together they weigh at most RECENT_SHARE of the 31 established authors; so
    do the same keys 10-20 minutes on, established but recent. Beside the pushers' one place
    honest authors still hold 80 %."""
    now = T0 + 3600
    standing = established_swarm(now)
    late = [f"late-{k}" for k in range(20)]
    for k, author in enumerate(late):
        standing.credit(author, now - 600 * k / 20, Provenance(place=f"198.{k}.0.0/16"))
    assert 0.0 < standing.of(late[10], now) < 1.0
    weights = standing.weights(ESTABLISHED + late, now)
    assert sum(weights[a] for a in late) == pytest.approx(RECENT_SHARE * 31)
    assert honest_share(weights) >= 0.8  # 1 / 1.2
    later = standing.weights(ESTABLISHED + late, now + 600)  # all 20 at full standing, for one more ramp
    assert min(standing.of(a, now + 600) for a in late) == 1.0
    assert honest_share(later) >= 0.8
    for k in range(3):  # and the pushers, each in the older releases' one place
        standing.credit(f"pusher-{k}", T0, Provenance(place=OLDER_RELEASES_PLACE))
    both = standing.weights([*ESTABLISHED, *late, "pusher-0", "pusher-1", "pusher-2"], now)
    assert honest_share(both) >= 0.8  # 31 / (31 + 1 + 0.2 x 32)


def test_a_lone_honest_newcomer_is_not_slowed_by_the_recent_cap():
    """One author that joins an established swarm weighs its standing plus the newcomers' budget
    (it is the only author below full standing), all through its ramp and the one after."""
    now = T0 + 3600
    standing = established_swarm(now)
    standing.credit("newcomer", now, Provenance(place="192.0.0.0/16"))
    for seconds in (0, 60, 300, 599, 600, 900, 1199):
        s = standing.of("newcomer", now + seconds)
        weights = standing.weights([*ESTABLISHED, "newcomer"], now + seconds)
        assert weights["newcomer"] == pytest.approx(s + (0.1 * (1 - s) if s < 1 else 0.0))
    assert s == 1.0


def test_a_swarm_that_starts_together_weighs_its_authors_alike():
    """Every author's clock starts at once: all are recent together for two ramps, the cap
    scales them alike, and a draw over them stays uniform, before, during and after."""
    standing = Standing(ramp_seconds=600, newcomer_share=0.1)
    authors = [f"a{k}" for k in range(12)]
    for k, author in enumerate(authors):
        standing.credit(author, T0, Provenance(place=f"10.{k}.0.0/16"))
    for seconds in (0, 2, 300, 700, 1100, 1300, 3600):
        weights = standing.weights(authors, T0 + seconds)
        assert len(set(weights.values())) == 1, (seconds, weights)


def test_fresh_keys_leave_an_established_authors_standing_unchanged():
    """Must show 2: 4,096 fresh keys, each with one signal group that this node asked for (about
    1.1 a second for an hour), stored as the exchange stores them, leave an established author's
    standing as it was; on main they evicted it (least recently credited first)."""
    settings = load_settings({"model": "tiny", "tasks": ["basic_arithmetic"]})
    inbox = node_inbox(settings)
    memory = NodeMemory(inbox, memory_for(settings, ME, inbox).intake, NodeCounters())
    signal = groups(2, seed=3)[0]
    memory.store(signal.model_copy(update={"origin": HONEST[0]}), T0, Provenance(place="203.0.0.0/16"))
    start = T0 + 1200
    assert inbox.standing.of(HONEST[0], start) == 1.0
    for k in range(MAX_AUTHORS):
        now = start + k * 3600 / MAX_AUTHORS
        memory.store(signal.model_copy(update={"origin": f"fresh-{k}"}), now, Provenance(place=f"fresh-{k}"))
        assert inbox.standing.of(HONEST[0], now) == 1.0
    assert len(inbox.standing) <= MAX_AUTHORS
    assert HONEST[0] in set(inbox.standing._table)
    weights = inbox.standing.weights([HONEST[0], "fresh-4095", "fresh-0"], start + 3600)
    assert weights[HONEST[0]] == 1.0


def test_standing_remembers_a_bounded_number_of_authors():
    standing = Standing(max_authors=100)
    for k in range(1000):  # a fresh key a second
        standing.credit(f"a{k}", T0 + k)
    newcomers, established = standing._table.records()
    assert len(newcomers) == 50 and len(established) <= 50
    # the first keys ran their ramp and hold the established half; later ones wait among newcomers
    assert [a for a, _ in established][:3] == ["a0", "a1", "a2"] and standing.of("a0", T0 + 1000) == 1.0
    assert "a999" in set(standing._table) and "a998" not in set(standing._table)  # the newest slot churns


def test_keys_behind_one_address_group_share_one_budget():
    standing = Standing(ramp_seconds=600, newcomer_share=0.1)
    standing.credit("honest", T0, Provenance(place="ip4:203.0"))
    for k in range(3):
        standing.credit(f"sybil-{k}", T0, Provenance(place="ip4:198.51"))
    for k in range(2):
        standing.credit(f"relayed-{k}", T0)  # no place known: "unknown", one place for all of them
    now = T0 + 1300
    standing.credit("fresh-neighbour", now, Provenance(place="ip4:203.0"))
    weights = standing.weights(
        ["honest", "sybil-0", "sybil-1", "sybil-2", "fresh-neighbour", "relayed-0", "relayed-1", "unlocated"], now
    )
    assert sum(weights[f"sybil-{k}"] for k in range(3)) == 1.0  # three keys, one machine: one author's worth
    # a place weighs what its best author weighs, shared in proportion: a fresh key beside an
    # established author takes little from it
    assert weights["honest"] + weights["fresh-neighbour"] == pytest.approx(1.0) and weights["honest"] > 0.95
    assert weights["relayed-0"] + weights["relayed-1"] + weights["unlocated"] == pytest.approx(1.0)


def test_a_saved_standing_reads_back_and_an_old_one_is_taken_over():
    standing = Standing(ramp_seconds=600)
    standing.credit("old", T0, Provenance(place="ip4:203.0"))
    standing.credit("new", T0 + 1000)
    standing.screened("old", 0.5)
    restored = Standing(ramp_seconds=600)
    restored.restore(json.loads(json.dumps(standing.to_json())))
    assert restored.to_json() == standing.to_json()
    # 0.4.x saved [author, earned seconds, last credited, place], least recently credited first
    before = Standing(ramp_seconds=600)
    before.restore([["full", 600.0, T0 + 50, "ip4:1.2"], ["half", 300.0, T0 + 100, None]])
    assert before.of("full", T0 + 100) == 1.0 and before.of("half", T0 + 100) == 0.5
    before.restore(None)  # saved with standing off
    assert len(before) == 0
