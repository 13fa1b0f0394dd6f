"""protocol/toolkit/buckets.py, the one token bucket: refill, takes, debt, and one bucket per key, bounded;
and the arithmetic each of its users had before (pinned here as they wrote it) gives the same
verdicts and tokens on the same steps."""

import random

import pytest

from sapo.protocol.toolkit.buckets import UNBOUNDED_DEBT, TokenBucket, TokenBuckets


def test_tokens_come_back_at_the_rate_up_to_the_burst():
    bucket = TokenBucket(rate=2.0, burst=4, now=0.0)
    assert [bucket.take(0.0) for _ in range(5)] == [True] * 4 + [False]
    assert bucket.refill(0.5) == 1.0  # one back per half second
    assert bucket.refill(100.0) == 4.0  # never more than the burst
    assert bucket.refill(50.0) == 4.0 and bucket.updated == 50.0  # a clock that went back adds nothing


def test_a_take_is_all_or_nothing_and_take_short_says_what_was_missing():
    bucket = TokenBucket(rate=1.0, burst=3, now=0.0)
    assert not bucket.take(0.0, cost=4.0) and bucket.tokens == 3.0
    assert bucket.take_short(0.0, cost=2.0) == 0.0 and bucket.tokens == 1.0
    assert bucket.take_short(0.0, cost=3.0) == 2.0 and bucket.tokens == 0.0  # spent what it had


def test_a_charge_runs_a_debt_down_to_the_floor_which_refills_pay_back_first():
    bucket = TokenBucket(rate=10.0, burst=5, now=0.0, floor=-5.0)
    bucket.charge(7.0)
    assert bucket.tokens == -2.0
    bucket.charge(100.0)
    assert bucket.tokens == -5.0  # the floor
    assert not bucket.take(0.5)  # 5 back: out of debt, nothing to spend yet
    assert bucket.take(0.75)
    bucket.charge(1.0, now=100.0)  # refilled to the burst first
    assert bucket.tokens == 4.0


def test_a_debt_without_floor_is_waited_out():
    bucket = TokenBucket(rate=1000.0, burst=1000, now=0.0, floor=UNBOUNDED_DEBT)
    bucket.charge(1500.0)
    assert bucket.debt_seconds() == 0.5
    bucket.refill(0.5)
    assert bucket.debt_seconds() == 0.0


def test_one_bucket_per_key_the_least_recently_used_forgotten():
    buckets: TokenBuckets[str] = TokenBuckets(rate=1.0, burst=1, capacity=2)
    assert buckets.take("a", 0.0) and not buckets.take("a", 0.0)
    assert buckets.take("b", 0.0)
    assert not buckets.take("a", 0.0)  # "a" is now the most recently used
    assert buckets.take("c", 0.0)  # past the capacity "b" goes
    assert len(buckets) == 2 and [key for key, _, _ in buckets.entries()] == ["a", "c"]
    assert buckets.take("b", 0.0)  # forgotten: a full bucket again
    buckets.charge("nobody", 5.0)  # a key not held: nothing to charge
    assert [key for key, _, _ in buckets.entries()] == ["c", "b"]


def test_entries_restore_to_the_same_buckets():
    buckets: TokenBuckets[str] = TokenBuckets(rate=2.0, burst=3, capacity=8, floor=-3.0)
    for key, now in [("a", 0.0), ("b", 0.1), ("a", 0.2)]:
        buckets.take(key, now)
    buckets.charge("a", 10.0)
    copy: TokenBuckets[str] = TokenBuckets(rate=2.0, burst=3, capacity=8, floor=-3.0)
    copy.restore(buckets.entries())
    assert copy.entries() == buckets.entries() == [("b", 2.0, 0.1), ("a", -3.0, 0.2)]


# --- the same steps, the same verdicts as each user's own arithmetic before --------------------


def steps(seed: int, count: int = 2000) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    now, out = 0.0, []
    for _ in range(count):
        now += rng.choice([0.0, 0.0, rng.random() * 0.05, rng.random() * 2, -rng.random() * 0.01])
        out.append((now, rng.choice([0.0, 0.0, 0.5, 3.0, 40.0])))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_the_intakes_budget_as_it_was(seed):
    """node/core/intake.py before: one verification a take, and CPU beyond it charged as debt
    down to minus one burst."""
    rate, burst = 40.0, 100
    tokens, updated = float(burst), 0.0
    bucket = TokenBucket(rate, burst, 0.0, floor=-float(burst))
    for now, extra in steps(seed):
        tokens = min(float(burst), tokens + max(0.0, now - updated) * rate)
        allowed = tokens >= 1.0
        tokens, updated = (tokens - 1.0 if allowed else tokens), now
        assert bucket.take(now) is allowed
        if allowed and extra:
            tokens = max(-float(burst), tokens - extra)
            bucket.charge(extra)
        assert (bucket.tokens, bucket.updated) == (tokens, updated)


@pytest.mark.parametrize("seed", range(5))
def test_the_peer_guards_publishes_as_they_were(seed):
    """protocol/peers/peer_guard.py before: a publish costs its gap in sequence numbers; short of
    tokens, the bucket empties and the author is charged what was missing."""
    rate, burst = 50.0, 100.0
    tokens, updated = burst, 0.0
    bucket = TokenBucket(rate, burst, 0.0)
    for now, cost in steps(seed):
        now = max(now, updated)  # a monotonic clock
        tokens = min(burst, tokens + max(0.0, now - updated) * rate)
        updated = now
        over = 0.0
        if tokens >= cost:
            tokens -= cost
        else:
            over, tokens = cost - tokens, 0.0
        assert bucket.take_short(now, cost) == over and bucket.tokens == tokens
