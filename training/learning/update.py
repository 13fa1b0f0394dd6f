"""One GRPO update on a round's training rows, local and external alike."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import torch
from torch.profiler import record_function  # labels the update's phases for bench/update_profile.py

from sapo.training.completions.generation import ANSWER_CLOSE
from sapo.training.config import TrainingSettings
from sapo.training.decoder.hf_cache import CACHE
from sapo.training.decoder.packed_forward import PackedForward, fits, pack_rows, unpack
from sapo.training.learning.grpo import clipped_policy_loss
from sapo.training.models.policy import Policy
from sapo.training.problems.rollouts import TrainingRows


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
    behavior: tuple[tuple[float, ...] | None, ...] = ()

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


def encode_rows(policy: Policy, rows: TrainingRows, max_completion_tokens: int) -> EncodedBatch | None:
    """Re-encode prompt and completion text with this node's own tokenizer.

    A peer's completion is plain text, so it is tokenized here exactly like a local one:
    the same prompt rendering, the same truncation, EOS after a finished answer. One batched
    tokenizer call covers all prompts and one all completions. A row's sender log-probs stay
    with it only if re-encoding gave back the tokens the sender sampled.
    """
    if not rows.rows:
        return None
    tokenizer = policy.tokenizer
    prompt_ids = tokenizer([policy.prompt(p) for p in rows.problems], add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer([row.completion for row in rows.rows], add_special_tokens=False)["input_ids"]
    completions: list[list[int]] = []
    advantages: list[float] = []
    group_of: list[int] = []
    behavior: list[tuple[float, ...] | None] = []
    for row, encoded in zip(rows.rows, completion_ids):
        ids = list(encoded)[:max_completion_tokens]
        sender = row.behavior if row.behavior is not None and len(row.behavior) == len(ids) else None
        ids = encode_completion(tokenizer, row.completion, ids, max_completion_tokens)
        if not ids:
            continue
        completions.append(ids)
        advantages.append(row.advantage)
        group_of.append(row.question)
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


def encode_completion(tokenizer, text: str, ids: list[int], max_completion_tokens: int) -> list[int]:
    """A completion's token ids as the update trains them: truncated to the generation cap, with
    end-of-sequence after a finished answer (what the policy sampled to stop)."""
    ids = ids[:max_completion_tokens]
    if text.rstrip().endswith(ANSWER_CLOSE) and len(ids) < max_completion_tokens:
        ids = [*ids, tokenizer.eos_token_id]
    return ids


def completion_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int
) -> torch.Tensor:
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
    logits = shared_prompt_logits(model, prompt, completions)
    picked = logits.gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def shared_prompt_logits(model, prompt: list[int], completions: torch.Tensor) -> torch.Tensor:
    """The fp32 logits that predict each completion token, [rows, width, vocabulary], for rows
    that share one prompt, run once (`shared_prompt_logprobs`, the screen's training/learning/typicality.py)."""
    device = completions.device
    rows, width = completions.shape
    prompt_ids = torch.tensor([prompt], device=device)
    out = model(input_ids=prompt_ids, use_cache=True, logits_to_keep=1)
    cache = getattr(out, CACHE)
    cache.batch_repeat_interleave(rows)
    attention = torch.ones((rows, len(prompt) + width), dtype=torch.long, device=device)
    positions = torch.arange(len(prompt), len(prompt) + width, device=device).expand(rows, width)
    # Padding sits after each completion, so causal attention keeps it out of the real tokens.
    tail = model(
        input_ids=completions, attention_mask=attention, position_ids=positions, use_cache=True, **{CACHE: cache}
    )
    return torch.cat([out.logits[:, -1:, :].expand(rows, 1, -1), tail.logits[:, :-1, :]], dim=1).float()


def settle_old_logprobs(
    batch: EncodedBatch, old_logprobs: torch.Tensor, weights: torch.Tensor, rows: list[int], logprobs: torch.Tensor
) -> None:
    """Record the rows' log-probs before any step moved the policy, and with them each row's
    weight: 1, or for a row with its sender's log-probs, min(1, exp(mean over its sampled tokens
    of log p_ours - log p_sender)). A peer's completion that this policy finds less likely than
    its sender did counts for less; one it finds likelier counts fully (truncated at 1, so a
    weight never amplifies another policy's text)."""
    old_logprobs[rows, : logprobs.shape[1]] = logprobs
    for row in rows:
        sender = batch.behavior[row] if row < len(batch.behavior) else None
        if sender is not None:
            gap = float((old_logprobs[row, : len(sender)] - torch.tensor(sender, device=old_logprobs.device)).mean())
            weights[row] = min(1.0, math.exp(gap))


ACTIVATION_BUDGET_BYTES = 2 * 2**30


def activation_bytes(config) -> tuple[int, int]:
    """Bytes a forward pass keeps for its backward: per token, and per completion position's logits.

    Per token, a decoder layer keeps roughly 16 hidden-size and 4 MLP-size fp32 values; each
    completion position adds its vocabulary logits (kept three times: the logits, their fp32
    copy and the log-softmax)."""
    return 4 * config.num_hidden_layers * (
        16 * config.hidden_size + 4 * config.intermediate_size
    ), 12 * config.vocab_size


def auto_micro_batch_size(model, batch: EncodedBatch, activation_budget_bytes: float = ACTIVATION_BUDGET_BYTES) -> int:
    """Rows per forward/backward pass, padded to the round's longest, that keep activations near
    the budget. Small models fit a round in one pass."""
    per_token, per_logit = activation_bytes(model.config)
    width = batch.completion_length
    per_row = per_token * (max(len(p) for p in batch.prompts) + width) + per_logit * width
    return max(1, int(activation_budget_bytes // per_row))


def make_optimizer(policy: Policy, settings: TrainingSettings) -> torch.optim.Optimizer:
    params = policy.trainable_parameters()
    if settings.lr is None:
        raise ValueError("settings.lr is None: set it, or fill it with training.config.default_learning_rate")
    if settings.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    return torch.optim.Adam(params, lr=settings.lr)


def grpo_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    rows: TrainingRows,
    settings: TrainingSettings,
    rng: random.Random,
) -> UpdateStats:
    """`updates_per_batch` passes of `minibatches` clipped steps each, from old log-probs taken once."""
    started, cpu_started = time.perf_counter(), time.process_time()
    with record_function("update: encode"):
        batch = encode_rows(policy, rows, settings.max_new_tokens)
    if batch is None:
        return UpdateStats(
            time.perf_counter() - started, 0, 0, 0.0, 0.0, skipped=True, cpu_seconds=time.process_time() - cpu_started
        )
    device = policy.device
    policy.model.eval()  # no dropout: old and new log-probs must come from the same function
    advantages = batch.advantages.to(device)
    layout = pass_layout(policy, batch, settings)
    plan = step_plan(batch, settings, rng)

    # Old log-probs: the first step runs on unchanged weights, so its own forward pass gives
    # them exactly; every other row needs one gradient-free pass before anything moves.
    # [B, C] for the round's longest row C; a piece of width w reads and writes its first w columns.
    old_logprobs = torch.zeros((len(batch.completions), batch.completion_length), device=device)
    weights = torch.ones(len(batch.completions), device=device)
    first_step = set(plan[0])
    later = [r for r in range(len(batch.completions)) if r not in first_step]
    with torch.no_grad(), record_function("update: old log-probs"):
        for piece in layout.pieces(later):
            settle_old_logprobs(batch, old_logprobs, weights, piece, layout.logprobs(policy, piece)[0])

    losses, clips = [], []
    for step, step_rows in enumerate(plan):
        step_tokens = sum(len(batch.completions[r]) for r in step_rows)
        optimizer.zero_grad(set_to_none=True)
        step_loss = step_clipped = 0.0
        # Gradient accumulation over micro-batches: each piece's token-mean is reweighted by
        # its share of the step's tokens, so the gradient equals the whole step's token-mean
        # and only peak memory depends on the micro-batch size.
        for piece in layout.pieces(step_rows):
            with record_function("update: forward"):
                logprobs, mask = layout.logprobs(policy, piece)
            width = logprobs.shape[1]
            if step == 0:
                settle_old_logprobs(batch, old_logprobs, weights, piece, logprobs.detach())
            loss, stats = clipped_policy_loss(
                logprobs,
                old_logprobs[piece, :width],
                advantages[piece] * weights[piece],
                mask,
                settings.eps_low,
                settings.eps_high,
            )
            share = float(mask.sum()) / step_tokens
            with record_function("update: backward"):
                (loss * share).backward()
            step_loss += stats["loss"] * share
            step_clipped += stats["clip_fraction"] * share
        with record_function("update: optimizer"):
            torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), settings.max_grad_norm)
            optimizer.step()
        losses.append(step_loss)
        clips.append(step_clipped)
    return UpdateStats(
        seconds=time.perf_counter() - started,
        sequences=len(batch.completions),
        tokens=sum(len(c) for c in batch.completions),
        loss=sum(losses) / len(losses),
        clip_fraction=sum(clips) / len(clips),
        skipped=False,
        optimizer_steps=len(plan),
        cpu_seconds=time.process_time() - cpu_started,
    )


def pass_layout(policy: Policy, batch: EncodedBatch, settings: TrainingSettings) -> PassLayout:
    """Packed rows where the model fits training/decoder/packed_forward.py, else its own forward's layout."""
    if fits(policy.model):
        forward = PackedForward(policy.model, torch.bfloat16 if policy.bf16 else torch.float32)
        return PassLayout(batch, settings.micro_batch_size or len(batch.completions), False, forward)
    return PassLayout(
        batch, settings.micro_batch_size or auto_micro_batch_size(policy.model, batch), batch.shared_prompt_saves()
    )


def step_plan(batch: EncodedBatch, settings: TrainingSettings, rng: random.Random) -> list[list[int]]:
    """The rows of each optimizer step: `updates_per_batch` passes of `minibatches` steps.

    Minibatches hold whole question groups: a group's advantages sum to zero, so the tokens
    its completions share (the answer tag, say) get no net push. Split across steps, they
    would, and Adam turns that noise into full-size updates."""
    rows_of: dict[int, list[int]] = {}
    for row, group in enumerate(batch.group_of):
        rows_of.setdefault(group, []).append(row)
    groups_order = list(rows_of)
    chunks = max(1, min(settings.minibatches, len(groups_order)))
    plan: list[list[int]] = []
    for _ in range(settings.updates_per_batch):
        rng.shuffle(groups_order)
        plan += [[r for g in groups_order[part::chunks] for r in rows_of[g]] for part in range(chunks)]
    return plan


@dataclass(frozen=True)
class PassLayout:
    """How rows go through forward passes.

    A Llama-family model runs on `packed` (training/decoder/packed_forward.py): a pass holds whole
    groups' rows end to end, no padding, each group's prompt once, up to `budget` bytes of
    activations. Any other model runs through its own forward: at most `micro` rows a pass, and
    with a shared prompt (when it saves work) only rows of one group, padded to the pass's
    longest row."""

    batch: EncodedBatch
    micro: int
    shared: bool
    packed: PackedForward | None = None
    budget: float = ACTIVATION_BUDGET_BYTES

    def pieces(self, rows: list[int]) -> list[list[int]]:
        # Never sorted by length: a group's advantages cancel on the tokens its rows share only
        # up to float rounding, and Adam turns that rounding into full-size steps; reordering rows
        # within a pass changed it enough to move the closing tag (tests/training/test_off_policy_rows.py, own-all).
        micro = self.micro
        by_group: dict[int, list[int]] = {}
        for row in rows:
            by_group.setdefault(self.batch.group_of[row], []).append(row)
        if self.packed is not None:
            return self._packed_pieces(self.packed, list(by_group.values()))
        if not self.shared:
            return [rows[i : i + micro] for i in range(0, len(rows), micro)]
        return [part[i : i + micro] for part in by_group.values() for i in range(0, len(part), micro)]

    def _packed_pieces(self, packed: PackedForward, groups: list[list[int]]) -> list[list[int]]:
        """Groups' rows in order, a new pass whenever the next row would pass the budget (or `micro` rows)."""
        per_token, per_logit = activation_bytes(packed.config)
        pieces: list[list[int]] = [[]]
        used = 0.0
        for members in groups:
            prompt = len(self.batch.prompts[self.batch.group_of[members[0]]])
            opened = False
            for row in members:
                length = len(self.batch.completions[row])
                cost = length * (per_token + per_logit) + (0 if opened else prompt * per_token)
                if pieces[-1] and (used + cost > self.budget or len(pieces[-1]) >= self.micro):
                    pieces.append([])
                    used, opened = 0.0, False
                    cost = length * (per_token + per_logit) + prompt * per_token
                pieces[-1].append(row)
                used += cost
                opened = True
        return [p for p in pieces if p]

    def logprobs(self, policy: Policy, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' completion log-probs under the policy now, and their mask: [rows, w]."""
        device, batch = policy.device, self.batch
        if self.packed is not None:
            packed = pack_rows(batch.prompts, batch.completions, batch.group_of, rows)
            return unpack(self.packed.logprobs(packed, device), packed.lengths)
        with policy.autocast():
            if self.shared:
                ids, mask = batch.completion_rows(rows)
                prompt = batch.prompts[batch.group_of[rows[0]]]
                return shared_prompt_logprobs(policy.model, prompt, ids.to(device)), mask.to(device)
            ids, attention, mask = batch.padded(rows)
            return completion_logprobs(policy.model, ids.to(device), attention.to(device), mask.shape[1]), mask.to(
                device
            )
