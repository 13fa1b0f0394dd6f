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
