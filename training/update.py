"""One GRPO update on a round's question groups, local and external alike."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import torch

from sapo.training.config import TrainingSettings
from sapo.training.grpo import clipped_policy_loss, group_advantages, has_signal
from sapo.training.hf_cache import CACHE
from sapo.training.policy import Policy
from sapo.training.rollouts import QuestionGroup
from sapo.training.generation import ANSWER_CLOSE


@dataclass(frozen=True)
class EncodedBatch:
    """A round's groups in this node's tokens: one prompt per group, one completion per row.

    `padded(rows)` lays rows out for one forward pass: prompts left-padded, completions
    right-padded to the longest completion C among those rows (`width_of(rows)`), so every
    completion starts at the same column and only the last C+1 positions need logits (the
    prompt's never do). Padding to the piece's own longest row, not the round's, matters: with
    early stops most groups end well before the longest row of the round, and every padded
    position costs a full forward and backward pass and a vocabulary-wide log-softmax.
    """

    prompts: list[list[int]]  # per group
    completions: list[list[int]]  # per row
    group_of: list[int]  # which group each row belongs to
    advantages: torch.Tensor  # [B]
    pad_id: int
    # per row: the sampling policy's log-probs of its tokens, where they can be compared with
    # ours (an off-policy row from a peer with our tokenizer, at temperature 1); else None
    behavior: tuple[list[float] | None, ...] = ()

    @property
    def completion_length(self) -> int:
        return max(len(c) for c in self.completions)

    # The whole batch padded at once (what the plain forward pass sees), for tools and tests.
    @property
    def completion_mask(self) -> torch.Tensor:
        return self.padded(range(len(self.completions)))[2]

    @property
    def input_ids(self) -> torch.Tensor:
        return self.padded(range(len(self.completions)))[0]

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.padded(range(len(self.completions)))[1]

    def width_of(self, rows) -> int:
        return max(len(self.completions[r]) for r in rows)

    def padded(self, rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = list(rows)
        width = self.width_of(rows)
        prompt_len = max(len(self.prompts[self.group_of[r]]) for r in rows)
        input_ids = torch.full((len(rows), prompt_len + width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        completion_mask = torch.zeros((len(rows), width), dtype=torch.float32)
        for i, row in enumerate(rows):
            prompt, completion = self.prompts[self.group_of[row]], self.completions[row]
            input_ids[i, prompt_len - len(prompt) : prompt_len] = torch.tensor(prompt)
            input_ids[i, prompt_len : prompt_len + len(completion)] = torch.tensor(completion)
            attention[i, prompt_len - len(prompt) : prompt_len + len(completion)] = 1
            completion_mask[i, : len(completion)] = 1.0
        return input_ids, attention, completion_mask

    def completion_rows(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """Completions alone, right-padded to these rows' C: the part that follows a shared prompt."""
        rows = list(rows)
        ids = torch.full((len(rows), self.width_of(rows)), self.pad_id, dtype=torch.long)
        mask = torch.zeros(ids.shape, dtype=torch.float32)
        for i, row in enumerate(rows):
            completion = self.completions[row]
            ids[i, : len(completion)] = torch.tensor(completion)
            mask[i, : len(completion)] = 1.0
        return ids, mask

    def shared_prompt_saves(self) -> bool:
        """True when running each group's prompt once beats repeating it in every row: the
        usual SAPO case of G samples of short answers behind a long one-shot prompt."""
        padded = sum(len(self.prompts[g]) + len(c) for c, g in zip(self.completions, self.group_of))
        shared = sum(len(p) for p in self.prompts) + sum(len(c) for c in self.completions)
        return 2 * shared < padded


@dataclass(frozen=True)
class UpdateStats:
    seconds: float  # re-encoding and the clipped steps
    sequences: int
    tokens: int
    loss: float
    clip_fraction: float
    skipped: bool
    optimizer_steps: int = 0
    cpu_seconds: float = 0.0  # process CPU time over the whole update


def trained_rows(group: QuestionGroup, off_policy_rows: str = "all", own_rows: str = "all") -> list[tuple[str, float, int]]:
    """The (completion, advantage) rows a group contributes, advantages over the whole group.

    With `off_policy_rows="positive"`, a completion this node did not sample itself trains only
    when its advantage is positive. Its failures are what another policy wrote: pushing them
    down moves tokens they share with good answers (the `</answer>` tag) in contexts this
    policy would not produce, where it is least sure of them, and that push is not balanced by
    its own successes, on which those tokens are already near certain. `own_rows="positive"`
    does the same to the node's own completions (a control, not a recommendation).
    """
    advantages = group_advantages(torch.tensor(group.rewards)).tolist()
    rows = zip(group.completions, advantages, group.on_policy_rows(), range(len(group.completions)))
    return [(text, adv, index) for text, adv, own, index in rows
            if adv > 0 or (own_rows if own else off_policy_rows) == "all"]


def comparable_behavior(policy: Policy, group: QuestionGroup, index: int) -> list[float] | None:
    """The sender's log-probs of completion `index`, if they are comparable with this policy's."""
    behavior = group.behavior
    if behavior is None or group.on_policy_rows()[index] or behavior.tokenizer != policy.tokenizer_fingerprint:
        return None
    if behavior.temperature != 1.0:  # our log-probs are at temperature 1
        return None
    return behavior.token_logprobs[index] or None


def encode_groups(
    policy: Policy, groups: list[QuestionGroup], max_completion_tokens: int, off_policy_rows: str = "all",
    own_rows: str = "all",
) -> EncodedBatch | None:
    """Re-encode prompt and completion text with this node's own tokenizer.

    A peer's completion is plain text, so it is tokenized here exactly like a local one:
    the same prompt rendering, the same truncation, EOS after a finished answer. One batched
    tokenizer call covers all prompts and one all completions.
    Groups without signal (all-equal rewards) contribute nothing and are left out.
    """
    tokenizer = policy.tokenizer
    rows_of = [(g, trained_rows(g, off_policy_rows, own_rows)) for g in groups if has_signal(g.rewards)]
    if not rows_of:
        return None
    useful = [g for g, _ in rows_of]
    prompt_ids = tokenizer([policy.prompt(g.problem) for g in useful], add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer([text for _, rows in rows_of for text, _, _ in rows], add_special_tokens=False)["input_ids"]
    completions: list[list[int]] = []
    advantages: list[float] = []
    group_of: list[int] = []
    behavior: list[list[float] | None] = []
    cursor = 0
    for group_index, (group, rows) in enumerate(rows_of):
        for text, adv, index in rows:
            ids = list(completion_ids[cursor])[:max_completion_tokens]
            cursor += 1
            sender = comparable_behavior(policy, group, index)
            if sender is not None and len(sender) != len(ids):
                sender = None  # re-encoding did not give the tokens the sender sampled
            if text.rstrip().endswith(ANSWER_CLOSE) and len(ids) < max_completion_tokens:
                ids.append(tokenizer.eos_token_id)
            if not ids:
                continue
            completions.append(ids)
            advantages.append(adv)
            group_of.append(group_index)
            behavior.append(sender)
    if not completions:
        return None
    return EncodedBatch(
        prompts=[list(p) for p in prompt_ids],
        completions=completions,
        group_of=group_of,
        advantages=torch.tensor(advantages, dtype=torch.float32),
        pad_id=tokenizer.pad_token_id,
        behavior=tuple(behavior),
    )


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


def shared_prompt_logprobs(model, prompt: list[int], completions: torch.Tensor) -> torch.Tensor:
    """Like `completion_logprobs` for rows that share one prompt, which runs once.

    The prompt's keys and values are computed a single time and repeated for every row, so
    its cost (and its backward) is paid once instead of once per sample. The gradient is the
    same: each row's attention reads the same prompt activations, and their gradients add up.
    """
    device = completions.device
    rows, width = completions.shape
    prompt_ids = torch.tensor([prompt], device=device)
    out = model(input_ids=prompt_ids, use_cache=True, logits_to_keep=1)
    cache = getattr(out, CACHE)
    cache.batch_repeat_interleave(rows)
    attention = torch.ones((rows, len(prompt) + width), dtype=torch.long, device=device)
    positions = torch.arange(len(prompt), len(prompt) + width, device=device).expand(rows, width)
    # Padding sits after each completion, so causal attention keeps it out of the real tokens.
    tail = model(input_ids=completions, attention_mask=attention, position_ids=positions, use_cache=True,
                 **{CACHE: cache})
    logits = torch.cat([out.logits[:, -1:, :].expand(rows, 1, -1), tail.logits[:, :-1, :]], dim=1).float()
    picked = logits.gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def importance_weights(batch: EncodedBatch, old_logprobs: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Per row, 1 except for the given rows with the sender's log-probs: min(1, exp(mean over
    the sampled tokens of log p_ours - log p_sender)). A peer's completion that this policy
    finds less likely than its sender did counts for less; one it finds likelier counts fully
    (truncated at 1, so a weight never amplifies another policy's text)."""
    weights = torch.ones(len(batch.completions), device=old_logprobs.device)
    for row in rows:
        sender = batch.behavior[row] if row < len(batch.behavior) else None
        if sender is None:
            continue
        ours = old_logprobs[row, : len(sender)]
        gap = float((ours - torch.tensor(sender, device=ours.device)).mean())
        weights[row] = min(1.0, math.exp(gap))
    return weights


def auto_micro_batch_size(model, batch: EncodedBatch, activation_budget_bytes: float = 2 * 2**30) -> int:
    """Rows per forward/backward pass that keep activations near the budget.

    Per token, a decoder layer keeps roughly 16 hidden-size and 4 MLP-size fp32 values for its
    backward pass; each completion position adds its vocabulary logits (kept three times: the
    logits, their fp32 copy and the log-softmax). Small models fit a round in one pass.
    """
    config = model.config
    per_token = 4 * config.num_hidden_layers * (16 * config.hidden_size + 4 * config.intermediate_size)
    width = batch.completion_length
    per_row = per_token * (max(len(p) for p in batch.prompts) + width) + 12 * config.vocab_size * width
    return max(1, int(activation_budget_bytes // per_row))


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
    """`updates_per_batch` passes of `minibatches` clipped steps each, from old log-probs taken once."""
    started, cpu_started = time.perf_counter(), time.process_time()
    batch = encode_groups(policy, groups, settings.max_new_tokens, settings.off_policy_rows, settings.own_rows)
    if batch is None:
        return UpdateStats(time.perf_counter() - started, 0, 0, 0.0, 0.0, skipped=True, cpu_seconds=time.process_time() - cpu_started)
    device = policy.device
    model = policy.model
    model.eval()  # no dropout: old and new log-probs must come from the same function
    advantages = batch.advantages.to(device)
    micro = settings.micro_batch_size or auto_micro_batch_size(model, batch)
    shared = batch.shared_prompt_saves()

    def pieces(rows: list[int]) -> list[list[int]]:
        # With a shared prompt a forward pass holds rows of one group; otherwise any rows, in
        # group order. Not sorted by length, though a piece is padded to its longest row: a
        # group's advantages cancel on the tokens its rows share only up to float rounding, and
        # Adam turns that rounding into full-size steps; reordering rows within a pass changed
        # it enough to move the closing tag (tests/training/test_off_policy_rows.py, own-all).
        if not shared:
            return [rows[i : i + micro] for i in range(0, len(rows), micro)]
        by_group: dict[int, list[int]] = {}
        for row in rows:
            by_group.setdefault(batch.group_of[row], []).append(row)
        return [part[i : i + micro] for part in by_group.values() for i in range(0, len(part), micro)]

    def logprobs_of(rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        with policy.autocast():
            return _logprobs_of(rows)

    def _logprobs_of(rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if shared:
            ids, mask = batch.completion_rows(rows)
            prompt = batch.prompts[batch.group_of[rows[0]]]
            return shared_prompt_logprobs(model, prompt, ids.to(device)), mask.to(device)
        ids, attention, mask = batch.padded(rows)
        return completion_logprobs(model, ids.to(device), attention.to(device), mask.shape[1]), mask.to(device)

    # Minibatches hold whole question groups: a group's advantages sum to zero, so the tokens
    # its completions share (the answer tag, say) get no net push. Split across steps, they
    # would, and Adam turns that noise into full-size updates.
    rows_of: dict[int, list[int]] = {}
    for row, group in enumerate(batch.group_of):
        rows_of.setdefault(group, []).append(row)
    groups_order = list(rows_of)
    chunks = max(1, min(settings.minibatches, len(groups_order)))
    plan: list[list[int]] = []
    for _ in range(settings.updates_per_batch):
        rng.shuffle(groups_order)
        plan += [[r for g in groups_order[part::chunks] for r in rows_of[g]] for part in range(chunks)]

    # Old log-probs: the first step runs on unchanged weights, so its own forward pass gives
    # them exactly; every other row needs one gradient-free pass before anything moves.
    # [B, C] for the round's longest row C; a piece of width w reads and writes its first w columns.
    old_logprobs = torch.zeros((len(batch.completions), batch.completion_length), device=device)
    first_step = set(plan[0])
    later = [r for r in range(len(batch.completions)) if r not in first_step]
    if later:
        with torch.no_grad():
            for rows in pieces(later):
                logprobs = logprobs_of(rows)[0]
                old_logprobs[rows, : logprobs.shape[1]] = logprobs
    weigh = settings.importance_weight == "sequence" and any(b is not None for b in batch.behavior)
    if weigh:  # first-step rows are weighed when their own forward pass gives their old log-probs
        advantages = advantages * importance_weights(batch, old_logprobs, later)

    losses, clips = [], []
    for step, step_rows in enumerate(plan):
        step_tokens = sum(len(batch.completions[r]) for r in step_rows)
        optimizer.zero_grad(set_to_none=True)
        step_loss = step_clipped = 0.0
        # Gradient accumulation over micro-batches: each piece's token-mean is reweighted by
        # its share of the step's tokens, so the gradient equals the whole step's token-mean
        # and only peak memory depends on the micro-batch size.
        for rows in pieces(step_rows):
            logprobs, mask = logprobs_of(rows)
            width = logprobs.shape[1]
            if step == 0:
                old_logprobs[rows, :width] = logprobs.detach()
                if weigh:
                    advantages[rows] *= importance_weights(batch, old_logprobs, rows)[rows]
            loss, stats = clipped_policy_loss(
                logprobs, old_logprobs[rows, :width], advantages[rows], mask, settings.eps_low, settings.eps_high
            )
            share = float(mask.sum()) / step_tokens
            (loss * share).backward()
            step_loss += stats["loss"] * share
            step_clipped += stats["clip_fraction"] * share
        torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), settings.max_grad_norm)
        optimizer.step()
        losses.append(step_loss)
        clips.append(step_clipped)
    tokens = sum(len(c) for c in batch.completions)
    return UpdateStats(
        seconds=time.perf_counter() - started,
        sequences=len(batch.completions),
        tokens=tokens,
        loss=sum(losses) / len(losses),
        clip_fraction=sum(clips) / len(clips),
        skipped=False,
        optimizer_steps=len(plan),
        cpu_seconds=time.process_time() - cpu_started,
    )
