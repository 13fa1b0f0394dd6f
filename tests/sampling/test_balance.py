"""The local/external balance: fixed plans, and the adaptive rule by hand, its state a value."""

import pytest

from sapo.sampling.balance import HISTORY_LIMIT, AdaptiveBalance, BalanceState, FixedBalance


def play(balance, state: BalanceState, rounds: range, gain_per_j: float, external=None):
    """Rounds whose training raises the next round's local reward by `gain_per_j` for each external
    group trained on; each round's external side gets what it planned (or `external`, if given)."""
    reward = state.last.reward if state.last is not None else 0.0
    splits = []
    for r in rounds:
        plan = balance.plan(state, r)
        assert plan.index == r and plan.local + plan.external == balance.total
        splits.append((plan.local, plan.external))
        got = plan.external if external is None else external
        state = balance.observe(state, plan, got, reward)
        reward += gain_per_j * got  # shows in the next round's reward
    return state, splits


def test_a_fixed_balance_always_plans_its_split():
    balance = FixedBalance(6, 2)
    state = balance.initial()
    assert [(balance.plan(state, r).local, balance.plan(state, r).external) for r in (1, 2, 3)] == [(6, 2)] * 3
    assert balance.observe(state, balance.plan(state, 1), 2, reward=1.0) == state


def test_adaptive_balance_follows_the_measured_gain():
    balance = AdaptiveBalance(total=8, external=4, period=4)
    state = balance.initial()
    assert balance.plan(state, 1).external == 4  # nothing heard yet: the centre, not a probe
    state, splits = play(balance, state, range(1, 13), gain_per_j=0.01)  # more external groups gain more
    assert splits[:3] == [(4, 4), (3, 5), (5, 3)]  # then probes: J + 1 on even rounds, J - 1 on odd ones
    assert state.external == 6 and [j for _, j in state.history] == [5, 6]
    state, _ = play(balance, state, range(13, 45), gain_per_j=0.01)  # ... but a node always keeps one local group
    assert state.external == 7 and balance.plan(state, 46) == balance.plan(state, 46).__class__(46, 1, 7)
    state, _ = play(balance, state, range(45, 101), gain_per_j=-0.01)  # now fewer external groups gain more
    assert state.external == 0
    assert (balance.plan(state, 101).local, balance.plan(state, 102).external) == (8, 1)  # clipped, I + J kept
    # alone at J = 0: the "+" probe keeps asking for one group (how peers are noticed), unanswered
    # probes are not counted, and J stays
    alone, splits = play(balance, state, range(101, 131), gain_per_j=0.0, external=0)
    assert alone.external == 0 and set(splits) == {(8, 0), (7, 1)} and not alone.plus and not alone.minus


def test_adaptive_balance_holds_without_a_difference():
    balance = AdaptiveBalance(total=8, external=4, period=2)
    state, _ = play(balance, balance.initial(), range(1, 21), gain_per_j=0.0)
    assert state.external == 4 and len(state.history) == 9


def test_rounds_whose_external_side_came_back_empty_neither_probe_nor_move_j():
    # A lonely node: the inbox never has anything. Even a reward that rises every round, which
    # the rule would read as "more external groups gain more" on its probes, moves nothing.
    balance = AdaptiveBalance(total=8, external=4, period=2)
    state, splits = play(balance, balance.initial(), range(1, 31), gain_per_j=0.0, external=0)
    assert set(splits) == {(4, 4)} and state.external == 4 and not state.plus and not state.minus
    rising = balance.initial()
    for r in range(1, 31):
        plan = balance.plan(rising, r)
        rising = balance.observe(rising, plan, 0, reward=0.1 * r)
    assert rising.external == 4 and {j for _, j in rising.history} == {4}
    # peers appear: probing starts the round after the first round that got external groups
    plan = balance.plan(rising, 31)
    rising = balance.observe(rising, plan, 3, reward=3.2)
    assert balance.plan(rising, 32).external == 5 and balance.plan(rising, 33).external == 3


def test_a_probe_whose_external_side_came_back_empty_is_not_counted():
    balance = AdaptiveBalance(total=8, external=4, period=10)
    state = balance.initial()
    state = balance.observe(state, balance.plan(state, 1), 4, reward=0.0)  # the centre: no sample
    state = balance.observe(state, balance.plan(state, 2), 5, reward=0.5)  # the + probe got its groups
    state = balance.observe(state, balance.plan(state, 3), 0, reward=0.4)  # the - probe got none
    assert state.plus == pytest.approx((-0.1,)) and state.minus == ()  # round 2's gain, counted when round 3 ended
    after_empty = balance.plan(state, 4)
    assert after_empty.external == 4  # the round after it plans the centre, not a probe
    state = balance.observe(state, after_empty, 4, reward=0.9)
    assert state.plus == pytest.approx((-0.1,)) and state.minus == ()  # round 3's gain is not counted
    assert balance.plan(state, 5).external == 3  # probing again


def test_the_state_is_bounded_and_round_trips_through_json():
    balance = AdaptiveBalance(total=8, external=4, period=2)
    state, _ = play(balance, balance.initial(), range(1, 2 * HISTORY_LIMIT + 60), gain_per_j=0.0)
    assert len(state.history) == HISTORY_LIMIT
    assert BalanceState.model_validate_json(state.model_dump_json()) == state


def test_the_default_balance_adapts_only_a_node_that_trains_on_both_sides():
    from pydantic import ValidationError

    from sapo.node.core.settings import NodeSettings
    from sapo.sampling.config import SamplingSettings

    assert SamplingSettings().balance == "auto"  # a setting keeps the value it was given or defaulted to
    assert isinstance(SamplingSettings().balance_rule(trains=True), AdaptiveBalance)  # the winner of the studies
    # isolation (J = 0), peers-only (I = 0) and a generator keep the split they were asked for
    assert SamplingSettings(external=0).balance_rule(trains=True) == FixedBalance(4, 0)
    assert SamplingSettings(local=0, external=8).balance_rule(trains=True) == FixedBalance(0, 8)
    assert SamplingSettings().balance_rule(trains=False) == FixedBalance(4, 4)
    assert isinstance(SamplingSettings(external=0, balance="adaptive").balance_rule(trains=True), AdaptiveBalance)
    assert SamplingSettings(balance="fixed").balance_rule(trains=True) == FixedBalance(4, 4)
    isolated = SamplingSettings(external=0)
    assert SamplingSettings.model_validate(isolated.model_dump()) == isolated
    with pytest.raises(ValidationError, match="--generate-only with --balance adaptive"):
        NodeSettings.model_validate({"run": {"generate_only": True}, "sampling": {"balance": "adaptive"}})
    with pytest.raises(ValidationError, match="--balance adaptive keeps at least one local group"):
        SamplingSettings(local=0, external=8, balance="adaptive")
