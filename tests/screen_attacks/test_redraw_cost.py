"""Found reviewing eb83575: the screen's redraws multiply what a round's screening can cost, and
an attacker's group can cost far more than an honest one. A group may hold 64 completions (the
codec's limit) of up to 16 KB within 256 KiB; made of 63 right answers with text around them it
passes the intake (the answers are right) and the screen forwards 63 rows of max_new_tokens
each, where an honest node's group of G = 8 has about 4 short winners. An inbox of such groups,
each refused, made the screen forward 3 J of them a round (1 + SCREEN_REDRAWS), not J.

    nice -n 5 .venv/bin/python -m tests.screen_attacks.redraw_cost   # the same, at max_new_tokens 256, timed
"""

from __future__ import annotations

import random

from sapo.sampling.screen import winning
from sapo.training.completions.generation import GenerationResult
from sapo.training.learning.typicality import excess_surprise
from tests.screen_attacks.rounds import NOW, heavy, node_holding

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
    first = sum(len(row) for g in excess_surprise(policy, winning(selection.external), LIMIT) for row in g)
    redrawn = screening.selection.external[len(selection.external) :]
    added = sum(len(row) for g in excess_surprise(policy, winning(redrawn), LIMIT) for row in g)
    print(f"first draw: {len(selection.external)} groups, {first} tokens; redraws: {len(redrawn)} groups, {added}")
    # what the redraws may add: the screening of (1 + SCREEN_REDRAWS) J groups of this node's own size
    assert added <= 3 * J * G * LIMIT
