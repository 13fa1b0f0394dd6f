"""The local/external balance: fixed plans, and the adaptive rule by hand."""

from sapo.sampling.balance import AdaptiveBalance, FixedBalance


def split(balance, round_index: int) -> tuple[int, int]:
    plan = balance.plan(round_index)
    assert plan.index == round_index
    return plan.local, plan.external


def test_a_fixed_balance_always_plans_its_split():
    balance = FixedBalance(6, 2)
    assert [split(balance, r) for r in (1, 2, 3)] == [(6, 2)] * 3
    balance.observe(1, gain=1.0)
    assert split(balance, 4) == (6, 2) and balance.state_dict() is None


def test_adaptive_balance_follows_the_measured_gain():
    balance = AdaptiveBalance(total=8, external=4, period=4)
    assert split(balance, 2) == (3, 5) and split(balance, 3) == (5, 3)
    for r in range(1, 13):  # more external groups gain more
        _, j = split(balance, r)
        balance.observe(r, gain=0.01 * j)
    assert balance.external == 7 and sum(split(balance, 13)) == 8
    for r in range(13, 25):  # ... but a node always keeps one local group
        _, j = split(balance, r)
        balance.observe(r, gain=0.01 * j)
    assert balance.external == 7 and split(balance, 24) == (1, 7)
    for r in range(25, 53):  # now fewer external groups gain more
        _, j = split(balance, r)
        balance.observe(r, gain=-0.01 * j)
    assert balance.external == 0
    assert split(balance, 53) == (8, 0) and split(balance, 54) == (7, 1)  # clipped, I + J kept


def test_adaptive_balance_holds_without_a_difference():
    balance = AdaptiveBalance(total=8, external=4, period=2)
    for r in range(1, 21):
        balance.observe(r, gain=0.1)
    assert balance.external == 4


def test_the_default_balance_is_adaptive_unless_the_node_asked_for_a_one_sided_split():
    from pydantic import ValidationError

    from sapo.node.daemon.settings import NodeSettings
    from sapo.sampling.config import SamplingSettings

    assert SamplingSettings().balance == "adaptive"  # the winner of bench/results' tables
    # isolation (J = 0) and peers-only (I = 0) stay as asked, unless the balance is given
    assert SamplingSettings(external=0).balance == "fixed"
    assert SamplingSettings(local=0, external=8).balance == "fixed"
    assert SamplingSettings(external=0, balance="adaptive").balance == "adaptive"
    assert SamplingSettings(balance="fixed").balance == "fixed"
    # a copy re-validates to the same balance
    isolated = SamplingSettings(external=0)
    assert SamplingSettings.model_validate(isolated.model_dump()).balance == "fixed"
    # a generator never trains, so it has no gain to balance by
    generator = NodeSettings.model_validate({"run": {"generate_only": True}})
    assert generator.sampling.balance == "fixed" and generator.sampling.local == 4
    try:
        NodeSettings.model_validate({"run": {"generate_only": True}, "sampling": {"balance": "adaptive"}})
    except ValidationError as error:
        assert "--generate-only with --balance adaptive" in str(error)
    else:
        raise AssertionError("a generator with --balance adaptive was accepted")
