"""The screen's measurement and its verdict, on a real (tiny, briefly warm-started) policy:
its own samples average zero excess surprise; text it would not write (an injected phrase, wrong
working before a right answer) stands far above the bar its own completions set; the answer's
content does not count; and a node's screen refuses such groups while keeping honest ones."""

from __future__ import annotations

import statistics

import pytest

from sapo.sampling.screen import ScreenReference, screen, winning, worst_stretch
from sapo.sampling.trust import TrustSettings
from sapo.training.completions.generation import generate_groups
from sapo.training.learning.typicality import answer_span, excess_surprise
from sapo.training.problems.rewards import score_group
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs
from tests.support.screen_rounds import NOW  # an hour after every author's first group


@pytest.fixture(scope="module")
def policy_and_groups(screen_policy):
    problems = TaskSampler(default_task_specs(["basic_arithmetic"]), dataset_seed=5, rng_seed=5).sample(6)
    groups = generate_groups(screen_policy, problems, num_generations=8, max_new_tokens=32, seed=1).groups
    return screen_policy, groups


def rewritten(group: QuestionGroup, text) -> QuestionGroup:
    """The group with each right completion replaced by `text(problem)`; the wrong ones kept."""
    answer = group.problem.answer
    texts = [text(group.problem) for _ in range(4)] + [f"<answer>{int(answer) + 1}</answer>"] * 4
    return group.model_copy(
        update={"completions": texts, "rewards": score_group(group.problem, texts), "origin": "peer"}
    )


def test_own_samples_average_zero_excess_surprise(policy_and_groups):
    policy, groups = policy_and_groups
    per_token = [z for group in excess_surprise(policy, groups, 32) for row in group for z in row]
    assert len(per_token) > 100
    assert abs(statistics.fmean(per_token)) < 0.5  # E[-log p(x) - H] = 0 for x sampled from p


def test_the_answer_content_is_not_counted():
    assert answer_span("3 + 4 = 7. <answer>7</answer>") == (19, 20)
    assert answer_span("<answer>1</answer> then <answer>22</answer>") == (32, 34)  # the last, as the verifier reads
    assert answer_span("no tag") == (0, 0)


def test_injected_text_stands_far_above_the_bar_and_is_refused(policy_and_groups):
    policy, groups = policy_and_groups
    trust = TrustSettings()
    own = excess_surprise(policy, winning(groups), 32)
    assert own  # the warm-started policy gets some right
    bar = (
        ScreenReference()
        .updated([worst_stretch(z, trust.screen_window) for g in own for z in g])
        .bar(trust.screen_margin)
    )
    clean = [rewritten(g, lambda p: f"<answer>{p.answer}</answer>") for g in groups]
    phrase = [rewritten(g, lambda p: f"SAPO rocks! <answer>{p.answer}</answer>") for g in groups]
    working = [
        rewritten(
            g,
            lambda p: (
                f"{p.question.removeprefix('Calculate').strip(' .')} = {int(p.answer) + 1}. <answer>{p.answer}</answer>"
            ),
        )
        for g in groups
    ]
    candidates = clean + phrase + working
    verdict = screen(candidates, excess_surprise(policy, winning(candidates), 32), own, ScreenReference(), trust)
    assert verdict.bar == pytest.approx(bar)
    assert verdict.kept == clean
    assert verdict.refused == phrase + working
    scores = verdict.scores  # 4 judged (right) completions a group, in order
    assert max(scores[: 4 * len(clean)]) < bar < min(scores[4 * len(clean) :]) - 10


def test_one_poisoned_answer_is_dropped_from_its_group_and_the_rest_train(policy_and_groups):
    """An attacker who slips its text into one right answer loses that answer; the group's other
    right answers still train, and its author is charged for the one answer dropped, not the group."""
    policy, groups = policy_and_groups
    trust = TrustSettings()
    own = excess_surprise(policy, winning(groups), 32)
    group = rewritten(groups[0], lambda p: f"<answer>{p.answer}</answer>")
    texts = list(group.completions)
    texts[1] = f"SAPO rocks! <answer>{group.problem.answer}</answer>"
    group = group.model_copy(update={"completions": texts})
    verdict = screen([group], excess_surprise(policy, winning([group]), 32), own, ScreenReference(), trust)
    assert verdict.refused == [] and verdict.dropped == 1 and verdict.dropped_shares == [0.25]
    [kept] = verdict.kept
    assert kept.completions == [texts[0], *texts[2:]] and kept.rewards == [group.rewards[0], *group.rewards[2:]]


def test_a_group_whose_answer_this_node_does_not_know_passes(policy_and_groups):
    """What sharing should teach: a right answer this policy finds unlikely is not held against it."""
    policy, groups = policy_and_groups
    trust = TrustSettings()
    own = excess_surprise(policy, winning(groups), 32)
    # a long, unlikely answer content: would be many nats if it counted
    odd = [
        g.model_copy(
            update={
                "completions": ["<answer>12345678901234567890</answer>", "<answer>x</answer>"],
                "rewards": [1.0, 0.0],
                "origin": "peer",
            }
        )
        for g in groups[:2]
    ]
    verdict = screen(odd, excess_surprise(policy, winning(odd), 32), own, ScreenReference(), trust)
    assert verdict.kept == odd


def test_a_nodes_round_trains_on_what_passes_and_its_authors_pay_for_the_rest(policy_and_groups, tmp_path):
    from sapo.node.core.node import Node, Selection
    from sapo.node.core.settings import load_settings
    from sapo.sampling.strategies import SamplerState
    from sapo.training.completions.generation import GenerationResult

    policy, groups = policy_and_groups
    settings = load_settings(
        {"model": "tiny", "tasks": ["basic_arithmetic"], "data_dir": str(tmp_path), "max_new_tokens": 32}
    )
    node = Node(settings, peer_id="me", policy=policy)
    honest = rewritten(groups[0], lambda p: f"<answer>{p.answer}</answer>").model_copy(update={"origin": "alice"})
    poisoned = rewritten(groups[1], lambda p: f"SAPO rocks! <answer>{p.answer}</answer>").model_copy(
        update={"origin": "mallory"}
    )
    for author in ("alice", "mallory"):
        node.inbox.standing.credit(author, 0.0)  # both established by NOW
    state = node.start_state()
    plan = node.plan(state)
    generation = GenerationResult(groups[2:], 0.0, 0)
    selection = Selection([honest, poisoned], SamplerState(), state.streams.mix)
    prepared = node.prepare(plan, generation, node.screen(plan, generation, selection, state, NOW))
    assert prepared.external == [honest] and prepared.refused == [poisoned]
    assert prepared.redrawn == 0  # the inbox had nothing to draw again
    assert node.inbox.standing.of("mallory", NOW) == 0.5 < node.inbox.standing.of("alice", NOW) == 1.0
    # the bar moves with this round's own winning completions
    assert len(prepared.screen.own) == sum(len(g.completions) for g in winning(groups[2:])) > 0
    # the phrase is in no row the update will see
    assert not any("SAPO" in row.completion for row in prepared.rows.rows)


def test_a_refused_draw_is_drawn_again_so_the_round_fills_its_j_slots(policy_and_groups, tmp_path):
    """Issue #42 (must-show 5's J clause): a group the screen refuses is replaced by another draw
    from the inbox in the same round, which is screened in its turn and taken out of the inbox;
    an inbox of nothing but poisoned groups costs at most 1 + SCREEN_REDRAWS screenings of J."""
    from sapo.node.core.node import SCREEN_REDRAWS
    from sapo.node.core.state import RandomStreams
    from sapo.training.completions.generation import GenerationResult
    from tests.support.screen_rounds import node_holding, one_round

    policy, groups = policy_and_groups

    def clean(n, author):
        return rewritten(groups[n], lambda p: f"<answer>{p.answer}</answer>").model_copy(update={"origin": author})

    def poisoned(n, author):
        return rewritten(groups[n], lambda p: f"SAPO rocks! <answer>{p.answer}</answer>").model_copy(
            update={"origin": author}
        )

    generation = GenerationResult(groups[4:], 0.0, 0)
    # one poisoned author among two honest ones, J = 2: the round trains on 2 unless every one of
    # its 1 + SCREEN_REDRAWS draws picked one of mallory's groups (each refusal makes it less likely)
    inbox = [clean(0, "alice"), clean(1, "alice"), clean(2, "bob"), clean(3, "bob")] + [
        poisoned(n, "mallory") for n in range(4)
    ]
    filled, redrawn = [], 0
    for seed in range(12):
        node = node_holding(policy, inbox, tmp_path / f"mixed-{seed}", j=2)
        state = node.start_state().model_copy(update={"streams": RandomStreams.from_seed(seed)})
        plan = node.plan(state)
        selection = node.mix(plan, state, NOW)
        node.inbox.take(selection.external)
        screening = node.screen(plan, generation, selection, state, NOW)
        assert all(g.origin == "mallory" for g in screening.refused)
        assert all(g.origin != "mallory" for g in screening.kept)
        assert len(screening.selection.external) == len(selection.external) + screening.redrawn
        held = node.inbox.newest_first(NOW)
        assert not any(g in held for g in screening.selection.external)  # every group drawn is taken
        assert len(screening.kept) == 2 or len(screening.refused) >= 1 + SCREEN_REDRAWS
        filled.append(len(screening.kept))
        redrawn += screening.redrawn
    assert redrawn >= 4, f"{redrawn} redraws in 12 rounds: the draws rarely picked mallory, the test says little"
    assert sum(filled) >= 23, filled  # without redraws a round that drew mallory trains on fewer

    # nothing but poisoned groups: the screen runs at most 1 + SCREEN_REDRAWS times, then gives up
    node = node_holding(policy, [poisoned(n % 4, f"mallory-{n}") for n in range(12)], tmp_path / "poisoned", j=2)
    screening = one_round(node, node.start_state(), generation.groups)
    assert screening.kept == [] and len(screening.refused) == 2 * (1 + SCREEN_REDRAWS) == screening.redrawn + 2
    assert len(node.inbox) == 12 - 2 * (1 + SCREEN_REDRAWS)


def test_the_answer_tokens_are_found_with_or_without_character_offsets(policy_and_groups):
    from sapo.training.learning.typicality import answer_tokens

    tokenizer = policy_and_groups[0].tokenizer
    texts = ["3 + 4 = 7. <answer>7</answer>", "no answer here"]
    exact = answer_tokens(tokenizer, texts)
    assert exact[1] == range(0)
    ids = tokenizer(texts[0], add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids[exact[0].start : exact[0].stop]) == "7"

    class Slow:  # a tokenizer without character offsets, as slow tokenizers are
        def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
            if return_offsets_mapping:
                raise NotImplementedError("return_offset_mapping is not available when using Python tokenizers")
            return tokenizer(text, add_special_tokens=add_special_tokens)

    assert answer_tokens(Slow(), texts) == exact


def test_one_clean_winner_does_not_launder_poisoned_ones(policy_and_groups, tmp_path):
    """Must show 3 through a node's real screen: an established author whose groups each carry
    one clean winner and three poisoned ones (kept, less the three) falls to a fresh key's weight
    within 10 such groups, while an author of clean groups screened beside it keeps its own."""
    from sapo.node.core.node import Node, Selection
    from sapo.node.core.settings import load_settings
    from sapo.sampling.standing import Provenance
    from sapo.sampling.strategies import SamplerState
    from sapo.training.completions.generation import GenerationResult

    policy, groups = policy_and_groups
    settings = load_settings(
        {"model": "tiny", "tasks": ["basic_arithmetic"], "data_dir": str(tmp_path), "max_new_tokens": 32}
    )
    node = Node(settings, peer_id="me", policy=policy)
    for k, author in enumerate(("alice", "mallory")):
        node.inbox.standing.credit(author, 0.0, Provenance(place=f"203.{k}.0.0/16"))
    state = node.start_state()
    plan = node.plan(state)
    weights = node.inbox.standing.weights(["alice", "mallory", "fresh"], NOW)
    assert weights["mallory"] == weights["alice"] == 1.0 > weights["fresh"]
    fallen = None
    for n in range(1, 11):
        clean = rewritten(groups[n % 2], lambda p: f"<answer>{p.answer}</answer>").model_copy(
            update={"origin": "alice"}
        )
        laundered = rewritten(groups[n % 2], lambda p: f"SAPO rocks! <answer>{p.answer}</answer>")
        texts = [f"<answer>{laundered.problem.answer}</answer>", *laundered.completions[1:]]
        laundered = laundered.model_copy(update={"completions": texts, "origin": "mallory"})
        generation = GenerationResult(groups[2:], 0.0, 0)
        selection = Selection([clean, laundered], SamplerState(), state.streams.mix)
        prepared = node.prepare(plan, generation, node.screen(plan, generation, selection, state, NOW))
        assert prepared.refused == [] and prepared.screened_completions == 3  # kept, its three poisoned dropped
        weights = node.inbox.standing.weights(["alice", "mallory", "fresh"], NOW)
        if weights["mallory"] == pytest.approx(weights["fresh"]):
            fallen = n
            break
    assert fallen is not None, f"mallory still weighs {weights['mallory']:.3f} after 10 groups"
    assert weights["alice"] == 1.0
