"""One GRPO update on a round's question groups, local and external alike."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from sapo.training.config import TrainingSettings
from sapo.training.grpo import clipped_policy_loss, group_advantages, has_signal
from sapo.training.policy import Policy
from sapo.training.rollouts import QuestionGroup
from sapo.training.generation import ANSWER_CLOSE


@dataclass(frozen=True)
class EncodedBatch:
    input_ids: torch.Tensor  # [B, T], right-padded
    attention_mask: torch.Tensor  # [B, T]
    completion_mask: torch.Tensor  # [B, T-1], aligned with next-token log-probs
    advantages: torch.Tensor  # [B]
    group_of: list[int]  # which question group each row belongs to


@dataclass(frozen=True)
class UpdateStats:
    seconds: float
    sequences: int
    tokens: int
    loss: float
    clip_fraction: float
    skipped: bool


def encode_groups(policy: Policy, groups: list[QuestionGroup], max_completion_tokens: int) -> EncodedBatch | None:
    """Re-encode prompt and completion text with this node's own tokenizer.

    A peer's completion is plain text, so it is tokenized here exactly like a local one:
    the same prompt rendering, the same truncation, EOS after a finished answer.
    Groups without signal (all-equal rewards) contribute nothing and are left out.
    """
    tokenizer = policy.tokenizer
    rows: list[tuple[list[int], list[int]]] = []
    advantages: list[float] = []
    group_of: list[int] = []
    useful = [g for g in groups if has_signal(g.rewards)]
    if not useful:
        return None
    prompt_ids = tokenizer([policy.prompt(g.problem) for g in useful], add_special_tokens=False)["input_ids"]
    texts = [c for g in useful for c in g.completions]
    completion_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    cursor = 0
    for group_index, (group, prompt) in enumerate(zip(useful, prompt_ids)):
        group_adv = group_advantages(torch.tensor(group.rewards)).tolist()
        for text, adv in zip(group.completions, group_adv):
            ids = list(completion_ids[cursor])[:max_completion_tokens]
            cursor += 1
            if text.rstrip().endswith(ANSWER_CLOSE) and len(ids) < max_completion_tokens:
                ids.append(tokenizer.eos_token_id)
            if not ids:
                continue
            rows.append((list(prompt), ids))
            advantages.append(adv)
            group_of.append(group_index)
    length = max(len(p) + len(c) for p, c in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(rows), length), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    completion_mask = torch.zeros((len(rows), length - 1), dtype=torch.float32)
    for i, (prompt, completion) in enumerate(rows):
        seq = prompt + completion
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        # log-prob of token t+1 sits at position t
        completion_mask[i, len(prompt) - 1 : len(seq) - 1] = 1.0
    return EncodedBatch(
        input_ids, attention, completion_mask, torch.tensor(advantages, dtype=torch.float32), group_of
    )


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """log p(token_{t+1} | tokens_<=t) for every position, shape [B, T-1]."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1, :]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def make_optimizer(policy: Policy, settings: TrainingSettings) -> torch.optim.Optimizer:
    params = policy.trainable_parameters()
    if settings.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    return torch.optim.Adam(params, lr=settings.lr)


def grpo_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    groups: list[QuestionGroup],
    settings: TrainingSettings,
    rng: random.Random,
) -> UpdateStats:
    """Old log-probs once, then `updates_per_batch` passes of `minibatches` clipped steps each."""
    started = time.perf_counter()
    batch = encode_groups(policy, groups, settings.max_new_tokens)
    if batch is None:
        return UpdateStats(time.perf_counter() - started, 0, 0, 0.0, 0.0, skipped=True)
    device = policy.device
    input_ids = batch.input_ids.to(device)
    attention = batch.attention_mask.to(device)
    mask = batch.completion_mask.to(device)
    advantages = batch.advantages.to(device)
    model = policy.model
    model.eval()  # no dropout: old and new log-probs must come from the same function
    with torch.no_grad():
        old_logprobs = token_logprobs(model, input_ids, attention)
    losses, clips = [], []
    # Minibatches hold whole question groups: a group's advantages sum to zero, so the tokens
    # its completions share (the answer tag, say) get no net push. Split across steps, they
    # would, and Adam turns that noise into full-size updates.
    rows_of: dict[int, list[int]] = {}
    for row, group in enumerate(batch.group_of):
        rows_of.setdefault(group, []).append(row)
    groups_order = list(rows_of)
    chunks = max(1, min(settings.minibatches, len(groups_order)))
    for _ in range(settings.updates_per_batch):
        rng.shuffle(groups_order)
        for part in range(chunks):
            rows = [r for g in groups_order[part::chunks] for r in rows_of[g]]
            idx = torch.tensor(rows, device=device)
            logprobs = token_logprobs(model, input_ids[idx], attention[idx])
            loss, stats = clipped_policy_loss(
                logprobs, old_logprobs[idx], advantages[idx], mask[idx], settings.eps_low, settings.eps_high
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), settings.max_grad_norm)
            optimizer.step()
            losses.append(stats["loss"])
            clips.append(stats["clip_fraction"])
    return UpdateStats(
        seconds=time.perf_counter() - started,
        sequences=int(input_ids.shape[0]),
        tokens=int(mask.sum().item()),
        loss=sum(losses) / len(losses),
        clip_fraction=sum(clips) / len(clips),
        skipped=False,
    )
