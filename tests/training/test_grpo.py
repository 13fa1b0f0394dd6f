import math

import pytest
import torch

from sapo.training.learning.grpo import ADVANTAGE_EPS, clipped_policy_loss, group_advantages, has_signal


def test_advantages_hand_computed():
    # mean 0.25, unbiased std 0.5
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    expected = [0.75 / (0.5 + ADVANTAGE_EPS)] + [-0.25 / (0.5 + ADVANTAGE_EPS)] * 3
    assert adv.tolist() == pytest.approx(expected)


def test_partial_credit_advantages_keep_their_order():
    adv = group_advantages(torch.tensor([0.05, 0.25, 1.0, 0.05]))
    assert adv[2] > adv[1] > adv[0] == adv[3]
    assert float(adv.sum()) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("value", [0.0, 1.0, 0.01])
def test_all_equal_rewards_give_zero_advantage_and_no_signal(value):
    rewards = [value] * 8
    assert group_advantages(torch.tensor(rewards)).abs().max() == 0
    assert not has_signal(rewards)
    assert has_signal([0.0] * 7 + [1.0])


def _loss(ratio: float, advantage: float):
    logprob = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, stats = clipped_policy_loss(logprob, torch.zeros(1, 1), torch.tensor([advantage]), torch.ones(1, 1))
    loss.backward()
    return float(loss), float(logprob.grad), stats


def test_positive_advantage_clips_above_one_plus_eps_high():
    loss, grad, stats = _loss(1.5, 2.0)
    assert loss == pytest.approx(-1.28 * 2.0)
    assert grad == 0.0  # clipped: no push further up
    assert stats["clip_fraction"] == 1.0


def test_positive_advantage_below_one_is_not_clipped():
    loss, grad, _ = _loss(0.5, 2.0)
    assert loss == pytest.approx(-0.5 * 2.0)
    assert grad == pytest.approx(-0.5 * 2.0)  # d(-ratio*A)/dlogp = -ratio*A


def test_negative_advantage_clips_below_one_minus_eps_low():
    loss, grad, _ = _loss(0.5, -1.0)
    assert loss == pytest.approx(0.8 * 1.0)
    assert grad == 0.0


def test_negative_advantage_above_one_is_not_clipped():
    loss, grad, _ = _loss(1.5, -1.0)
    assert loss == pytest.approx(1.5)
    assert grad == pytest.approx(1.5)


def test_inside_the_clip_range_is_plain_policy_gradient():
    loss, grad, stats = _loss(1.1, 1.0)
    assert loss == pytest.approx(-1.1)
    assert stats["clip_fraction"] == 0.0


def test_token_mean_ignores_masked_positions():
    logprobs = torch.tensor([[0.0, 0.0, 5.0], [0.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    advantages = torch.tensor([1.0, -2.0])
    loss, stats = clipped_policy_loss(logprobs, torch.zeros_like(logprobs), advantages, mask)
    # ratio 1 on the three unmasked tokens: (-1 - 1 + 2) / 3
    assert float(loss) == pytest.approx(0.0)
    assert stats["tokens"] == 3
    loss2, _ = clipped_policy_loss(logprobs, torch.zeros_like(logprobs), torch.tensor([1.0, 1.0]), mask)
    assert float(loss2) == pytest.approx(-1.0)
