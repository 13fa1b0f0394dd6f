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
    """Prompts left-padded, completions right-padded, so every completion starts at the same
    column and only the last C+1 positions need logits (the prompt's never do)."""

    input_ids: torch.Tensor  # [B, P + C]
    attention_mask: torch.Tensor  # [B, P + C]
    completion_mask: torch.Tensor  # [B, C]
    advantages: torch.Tensor  # [B]
    group_of: list[int]  # which question group each row belongs to

    @property
    def completion_length(self) -> int:
        return self.completion_mask.shape[1]


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
    the same prompt rendering, the same truncation, EOS after a finished answer. One batched
    tokenizer call covers all prompts and one all completions.
    Groups without signal (all-equal rewards) contribute nothing and are left out.
    """
    tokenizer = policy.tokenizer
    useful = [g for g in groups if has_signal(g.rewards)]
    if not useful:
        return None
    prompt_ids = tokenizer([policy.prompt(g.problem) for g in useful], add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer([c for g in useful for c in g.completions], add_special_tokens=False)["input_ids"]
    rows: list[tuple[list[int], list[int]]] = []
    advantages: list[float] = []
    group_of: list[int] = []
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
    if not rows:
        return None
    prompt_len = max(len(p) for p, _ in rows)
    completion_len = max(len(c) for _, c in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(rows), prompt_len + completion_len), pad, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    completion_mask = torch.zeros((len(rows), completion_len), dtype=torch.float32)
    for i, (prompt, completion) in enumerate(rows):
        input_ids[i, prompt_len - len(prompt) : prompt_len] = torch.tensor(prompt)
        input_ids[i, prompt_len : prompt_len + len(completion)] = torch.tensor(completion)
        attention[i, prompt_len - len(prompt) : prompt_len + len(completion)] = 1
        completion_mask[i, : len(completion)] = 1.0
    return EncodedBatch(input_ids, attention, completion_mask, torch.tensor(advantages, dtype=torch.float32), group_of)


def completion_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int) -> torch.Tensor:
    """log p(completion token | everything before it), shape [B, C].

    Only the last C+1 positions get logits: the vocabulary projection of prompt positions is
    the bulk of the memory of a naive forward pass (49k x tokens for SmolLM2).
    """
    # Left padding shifts positions; explicit position ids keep them starting at 0 per row.
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=completion_length + 1,
    ).logits[:, :-1, :]
    targets = input_ids[:, -completion_length:]
    logits = logits.float()
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


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
    width = batch.completion_length
    model = policy.model
    model.eval()  # no dropout: old and new log-probs must come from the same function
    micro = settings.micro_batch_size
    with torch.no_grad():
        # computed once, reused by every pass; in micro-batches to bound memory
        old_logprobs = torch.cat(
            [
                completion_logprobs(model, input_ids[i : i + micro], attention[i : i + micro], width)
                for i in range(0, input_ids.shape[0], micro)
            ]
        )
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
            step_tokens = float(mask[rows].sum().clamp_min(1.0))
            optimizer.zero_grad(set_to_none=True)
            step_loss = step_clipped = 0.0
            # Gradient accumulation over micro-batches: each piece's token-mean is reweighted by
            # its share of the step's tokens, so the gradient equals the whole step's token-mean
            # and only peak memory depends on micro_batch_size.
            for i in range(0, len(rows), micro):
                idx = torch.tensor(rows[i : i + micro], device=device)
                logprobs = completion_logprobs(model, input_ids[idx], attention[idx], width)
                loss, stats = clipped_policy_loss(
                    logprobs, old_logprobs[idx], advantages[idx], mask[idx], settings.eps_low, settings.eps_high
                )
                share = float(mask[idx].sum()) / step_tokens
                (loss * share).backward()
                step_loss += stats["loss"] * share
                step_clipped += stats["clip_fraction"] * share
            torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), settings.max_grad_norm)
            optimizer.step()
            losses.append(step_loss)
            clips.append(step_clipped)
    return UpdateStats(
        seconds=time.perf_counter() - started,
        sequences=int(input_ids.shape[0]),
        tokens=int(mask.sum().item()),
        loss=sum(losses) / len(losses),
        clip_fraction=sum(clips) / len(clips),
        skipped=False,
    )
