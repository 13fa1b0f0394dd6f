"""The GRPO objective as pure functions: advantages per question group, and the clipped loss.

No KL term and no reference model (beta = 0), asymmetric clipping (eps_low 0.2, eps_high 0.28)
and a token-level mean over all completion tokens in the batch, as in the paper's run.
"""

from __future__ import annotations

import torch

ADVANTAGE_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, eps: float = ADVANTAGE_EPS) -> torch.Tensor:
    """(r - mean) / (std + eps) within one question group of G rewards.

    All-equal rewards give exactly zero: such a group carries no learning signal.
    """
    rewards = rewards.to(torch.float32)
    if rewards.numel() < 2 or bool(rewards.max() == rewards.min()):
        # exact zeros: float rounding of the mean must not invent a signal
        return torch.zeros_like(rewards)
    centered = rewards - rewards.mean()
    return centered / (rewards.std(unbiased=True) + eps)


def has_signal(rewards: list[float]) -> bool:
    """Whether a group's advantages are not all zero, i.e. its rewards are not all equal."""
    return len(rewards) >= 2 and max(rewards) != min(rewards)


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-style clipped surrogate, token-mean over the masked completion tokens.

    logprobs, old_logprobs, mask: [B, T]; advantages: [B] (one per completion).
    Returns the scalar loss to minimise and a few statistics.
    """
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.to(logprobs.dtype).unsqueeze(1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    tokens = mask.sum().clamp_min(1.0)
    loss = (per_token * mask).sum() / tokens
    with torch.no_grad():
        was_clipped = ((clipped < unclipped) & (mask > 0)).to(logprobs.dtype)
        stats = {
            "loss": float(loss.detach()),
            "clip_fraction": float(was_clipped.sum() / tokens),
            "ratio_mean": float((ratio * mask).sum() / tokens),
            "tokens": float(tokens),
        }
    return loss, stats
