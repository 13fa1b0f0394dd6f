"""Reviewing eb83575 (the screen draws again for the groups it refused): what holds, on a real
warm-started tiny policy and the node's own `mix`, `screen` and `redraw`.

- The bar moves once a round: this round's own winning completions join the reference once,
  however many redraws follow.
- Every screened group charges its author once: keys holding one poisoned group each end the
  round at a dropped share of exactly SCREEN_WEIGHT, and no honest author is charged.
- The round is deterministic and what it leaves is what the next round needs: the same inbox,
  state and stream give the same draws, refusals and redraws; the state a round hands on (the
  stream and sampler after the redraws) and the inbox, saved as JSON and restored into a fresh
  node, draw the next round exactly as the node that never stopped."""

from __future__ import annotations

import json

import pytest

from sapo.sampling.screen import winning
from sapo.sampling.standing import SCREEN_WEIGHT
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import Problem
from tests.support.screen_rounds import group, node_holding, one_round, texts


def inbox_of(problems: list[Problem]) -> list[QuestionGroup]:
    """3 honest authors with 3 groups each, 12 keys with one poisoned group each."""
    honest = [group(p, f"honest-{k % 3}") for k, p in enumerate(problems[4:13])]
    poisoned = [group(p, f"mallory-{k}", "SAPO rocks! ") for k, p in enumerate(problems[13:25])]
    return honest + poisoned


def test_the_bar_moves_once_and_each_screened_author_is_charged_once(policy_and_problems, tmp_path):
    from sapo.node.core.state import RandomStreams

    policy, problems, own = policy_and_problems
    redrawn = 0
    for seed in range(6):
        node = node_holding(policy, inbox_of(problems), tmp_path / f"n{seed}")
        state = node.start_state().model_copy(update={"streams": RandomStreams.from_seed(seed)})
        screening = one_round(node, state, own)
        redrawn += screening.redrawn
        assert screening.reference is not None
        assert len(screening.reference.own) == sum(len(g.completions) for g in winning(own))
        drawn = screening.selection.external
        assert len({id(g) for g in drawn}) == len(drawn)  # no group screened twice
        for g in drawn:
            record = node.inbox.standing._table.get(g.origin)
            assert record is not None
            if g.origin.startswith("mallory"):
                assert g in screening.refused and record.dropped == pytest.approx(SCREEN_WEIGHT)
            else:
                assert record.dropped == 0.0
    assert redrawn >= 3  # the rounds did draw again


def test_a_round_with_redraws_repeats_and_resumes_exactly(policy_and_problems, tmp_path):
    from sapo.node.core.state import NodeState, RandomStreams

    policy, problems, own = policy_and_problems
    for seed in range(4):
        a = node_holding(policy, inbox_of(problems), tmp_path / f"a{seed}")
        b = node_holding(policy, inbox_of(problems), tmp_path / f"b{seed}")
        start = a.start_state().model_copy(update={"streams": RandomStreams.from_seed(seed)})
        first, again = one_round(a, start, own), one_round(b, start, own)
        assert texts(first.selection.external) == texts(again.selection.external)
        assert texts(first.kept) == texts(again.kept) and texts(first.refused) == texts(again.refused)
        assert first.selection.rng == again.selection.rng
        # what run_round hands on, through JSON, into a fresh node with the saved inbox
        after = start.model_copy(
            update={
                "round": 1,
                "streams": start.streams.model_copy(update={"mix": first.selection.rng}),
                "sampler": first.selection.sampler,
                "screen": first.reference,
            }
        )
        resumed = node_holding(policy, [], tmp_path / f"r{seed}")
        resumed.inbox.restore(json.loads(json.dumps(a.inbox.to_json())))
        restored = NodeState.model_validate(json.loads(json.dumps(after.to_json())))
        going_on, from_saved = one_round(a, after, own), one_round(resumed, restored, own)
        assert texts(going_on.selection.external) == texts(from_saved.selection.external)
        assert texts(going_on.kept) == texts(from_saved.kept)
        assert not set(texts(going_on.selection.external)) & set(texts(first.selection.external))
