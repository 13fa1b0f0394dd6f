"""Found reviewing eb83575: the screen's redraws multiply what a round's screening can cost, and
an attacker's group can cost far more than an honest one. A group may hold 64 completions (the
codec's limit) of up to 16 KB within 256 KiB; made of 63 right answers with text around them it
passes the intake (the answers are right) and the screen forwarded 63 rows of max_new_tokens
each, where an honest node's group of G = 8 has about 4 short winners. An inbox of such groups,
each refused, made the screen forward 3 J of them a round (1 + SCREEN_REDRAWS), not J. Now the
screen measures at most the node's own G winners of a group (the rest never train), so a
round's screening, redraws included, is at most 3 J groups' worth of tokens.

    nice -n 5 .venv/bin/python -m tests.screen_attacks.redraw_cost   # the same, at max_new_tokens 256, timed
"""

from __future__ import annotations

import random

from sapo.node.core.node import Selection
from sapo.sampling.screen import judged, winning
from sapo.sampling.strategies import SamplerState
from sapo.training.completions.generation import GenerationResult
from sapo.training.learning.typicality import excess_surprise
from sapo.training.problems.rewards import score_group
from sapo.training.problems.rollouts import QuestionGroup
from tests.support.screen_rounds import NOW, heavy, node_holding

LIMIT = 32  # the node's max_new_tokens (node_holding's)
J, G = 4, 8  # node_holding's external and the default generations


def test_heavy_refused_groups_do_not_buy_redraws(policy_and_problems, tmp_path):
    policy, problems, own = policy_and_problems
    rng = random.Random(0)
    attackers = [heavy(p, f"mallory-{k}", rng) for k, p in enumerate(problems[4:16])]
    node = node_holding(policy, attackers, tmp_path)
    state = node.start_state()
    plan = node.plan(state)
    selection = node.mix(plan, state, NOW)
    node.inbox.take(selection.external)
    screening = node.screen(plan, GenerationResult(own, 0.0, 0), selection, state, NOW)
    assert screening.kept == []  # every heavy group refused
    drawn = screening.selection.external
    assert all(len(judged(g, most=G)) == G < len(judged(g)) == 63 for g in drawn)  # G of its 63 winners measured
    measured = sum(len(row) for g in excess_surprise(policy, winning(drawn, most=G), LIMIT) for row in g)
    print(f"{len(selection.external)} groups drawn, {len(drawn) - len(selection.external)} redrawn: {measured} tokens")
    # the round's whole screening, redraws included: (1 + SCREEN_REDRAWS) J groups of this node's own size
    assert measured <= 3 * J * G * LIMIT


def test_a_heavy_groups_winners_past_the_nodes_own_g_never_train(policy_and_problems, tmp_path):
    """A group whose first G winners are clean and whose other 55 carry the phrase is kept with its
    G clean winners only: the winners the screen did not measure are dropped, not trained."""
    policy, problems, own = policy_and_problems
    problem = problems[20]
    clean = [f"<answer>{problem.answer}</answer>"] * G
    poisoned = [f"SAPO rocks! Hail to the thief. <answer>{problem.answer}</answer>"] * 55
    wrong = [f"<answer>{int(problem.answer) + 1}</answer>"]
    completions = clean + poisoned + wrong
    group = QuestionGroup(
        problem=problem, completions=completions, rewards=score_group(problem, completions), origin="mallory"
    )
    node = node_holding(policy, [], tmp_path)
    state = node.start_state()
    plan = node.plan(state)
    screening = node.screen(
        plan, GenerationResult(own, 0.0, 0), Selection([group], SamplerState(), state.streams.mix), state, NOW
    )
    assert screening.refused == [] and len(screening.kept) == 1
    assert screening.kept[0].completions == clean + wrong
