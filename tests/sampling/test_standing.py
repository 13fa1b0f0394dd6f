"""Authors' standing: fresh identities, however many, cannot take a node's inbox or its training
from authors who earned their place over time. Frames go through the real codec and intake into
the inbox a node's settings build; the draw is the node's own (`choose_from_inbox`), and the rows
are the round's own pure step (`training_set`)."""

from __future__ import annotations

import random

from sapo.node.core.counters import NodeCounters
from sapo.node.core.exchange import GroupEncoder
from sapo.node.core.intake import node_intake
from sapo.node.core.memory import NodeMemory
from sapo.node.core.node import choose_from_inbox, node_inbox
from sapo.node.core.settings import load_settings
from sapo.node.study.nodes import peer_id_for
from sapo.sampling.standing import MAX_GAP_SECONDS, STRIKE_SECONDS, Standing
from sapo.sampling.strategies import SamplerState
from sapo.sampling.training_set import training_set
from sapo.training.problems.rewards import score_group
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs, reasoning_gym_version
from tests.support.receiving import Receiver

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
    # the node's defaults, but groups stay eligible for the test's whole quarter hour
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
    # four honest authors, one group every 15 s each for 12.5 minutes: 200 groups, full standing
    honest = groups(200, seed=1)
    for i, group in enumerate(honest):
        clock.now = T0 + 15 * (i // 4)
        assert intake.accept(encoders[HONEST[i % 4]].frame(group, i), HONEST[i % 4], clock.now) is not None
    assert len(inbox) == 200 and all(inbox.standing.of(peer) == 1.0 for peer in HONEST)
    # four fresh keys, 128 valid groups each (the most one author may hold), within a few seconds
    sybil = groups(512, seed=2)
    for i, group in enumerate(sybil):
        clock.now = T0 + 760 + i / 100
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


def test_standing_is_earned_by_time_spent_sending_and_lost_by_refusals():
    standing = Standing(ramp_seconds=600, newcomer_share=0.1)
    for minute in range(5):  # a group a minute for 5 minutes: 4 gaps of 60 s
        standing.credit("steady", T0 + 60 * minute)
    standing.credit("patient", T0)
    standing.credit("patient", T0 + 3600)  # an hour's wait counts as one gap
    assert standing.of("steady") == 4 * MAX_GAP_SECONDS / 600
    assert standing.of("patient") == MAX_GAP_SECONDS / 600
    standing.strike("steady")
    assert standing.of("steady") == (4 * MAX_GAP_SECONDS - STRIKE_SECONDS) / 600
    assert standing.of("stranger") == 0.0


def test_newcomers_share_one_budget_however_many_they_are():
    standing = Standing(ramp_seconds=60, newcomer_share=0.1)
    standing.credit("old", T0)
    standing.credit("old", T0 + 60)
    for n in (1, 10, 1000):
        weights = standing.weights(["old", *(f"new{k}" for k in range(n))])
        assert weights["old"] == 1.0
        assert abs(sum(w for a, w in weights.items() if a != "old") - 0.1) < 1e-9
    alike = standing.weights([f"new{k}" for k in range(5)])  # a swarm starting together: all alike
    assert len(set(alike.values())) == 1


def test_standing_remembers_a_bounded_number_of_authors():
    standing = Standing(max_authors=100)
    for k in range(1000):
        standing.credit(f"a{k}", T0 + k)
    assert len(standing._records) == 100 and standing.of("a999") == 0.0 and standing.of("a0") == 0.0


def test_keys_behind_one_address_group_share_one_budget():
    standing = Standing(ramp_seconds=60, newcomer_share=0.1)
    for author in ("honest", "sybil-0", "sybil-1", "sybil-2"):
        standing.credit(author, T0)
        standing.credit(author, T0 + 60)  # every one of them established
    standing.locate("honest", "ip4:203.0")
    for k in range(3):
        standing.locate(f"sybil-{k}", "ip4:198.51")
    weights = standing.weights(["honest", "sybil-0", "sybil-1", "sybil-2", "unlocated"])
    assert weights["honest"] == 1.0
    assert sum(weights[f"sybil-{k}"] for k in range(3)) == 1.0  # three keys, one machine: one author's worth
    assert weights["unlocated"] == 0.1  # a newcomer alone in its place, with the whole newcomers' budget
