"""Sampling G completions per question from the node's own policy."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from sapo.training.policy import Policy
from sapo.training.rewards import score_group
from sapo.training.rollouts import QuestionGroup
from sapo.training.tasks import Problem

ANSWER_CLOSE = "</answer>"


class GenerationInterrupted(RuntimeError):
    """Generation was stopped early because the node is shutting down."""


class _StopWhenSet(StoppingCriteria):
    # Checked once per decoding step: a shutdown does not wait for 256 more tokens.
    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


@dataclass(frozen=True)
class GenerationResult:
    groups: list[QuestionGroup]
    seconds: float
    new_tokens: int


def sample_completions(
    policy: Policy,
    prompts: list[str],
    *,
    num_generations: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    stop: threading.Event | None = None,
) -> tuple[list[list[str]], int]:
    """All questions x G samples in one batch, with a KV cache and left padding.

    Each sequence stops at EOS or at the closing </answer>; the decoded text keeps the tag.
    Returns the completions per prompt and the number of generated tokens.
    """
    tokenizer = policy.tokenizer
    tokenizer.padding_side = "left"
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    encoded = {k: v.to(policy.device) for k, v in encoded.items() if k in ("input_ids", "attention_mask")}
    torch.manual_seed(seed)
    was_training = policy.model.training
    policy.model.eval()
    with torch.inference_mode():
        output = policy.model.generate(
            **encoded,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            num_return_sequences=num_generations,
            stop_strings=[ANSWER_CLOSE],
            tokenizer=tokenizer,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            stopping_criteria=StoppingCriteriaList([_StopWhenSet(stop)]) if stop is not None else None,
        )
    if stop is not None and stop.is_set():
        raise GenerationInterrupted("generation stopped for shutdown")
    if was_training:
        policy.model.train()
    new_ids = output[:, encoded["input_ids"].shape[1] :]
    texts = [_trim_after_answer(t) for t in tokenizer.batch_decode(new_ids, skip_special_tokens=True)]
    special = {tokenizer.pad_token_id, tokenizer.eos_token_id}
    new_tokens = int(sum(1 for tok in new_ids.flatten().tolist() if tok not in special))
    grouped = [texts[i * num_generations : (i + 1) * num_generations] for i in range(len(prompts))]
    return grouped, new_tokens


def _trim_after_answer(text: str) -> str:
    # A stop string can end inside a token; anything decoded past the closing tag is noise.
    cut = text.find(ANSWER_CLOSE)
    return text if cut < 0 else text[: cut + len(ANSWER_CLOSE)]


def generate_groups(
    policy: Policy,
    problems: list[Problem],
    *,
    num_generations: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    sender_round: int = 0,
    stop: threading.Event | None = None,
) -> GenerationResult:
    """This round's local rollouts: sampled, decoded and scored by this node's verifier."""
    if not problems:
        return GenerationResult([], 0.0, 0)
    started = time.perf_counter()
    prompts = [policy.prompt(p) for p in problems]
    completions, new_tokens = sample_completions(
        policy,
        prompts,
        num_generations=num_generations,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        stop=stop,
    )
    now = time.time()
    groups = [
        QuestionGroup(
            problem=problem,
            completions=texts,
            rewards=score_group(problem, texts),
            model_id=policy.model_id,
            sender_round=sender_round,
            created_at=now,
        )
        for problem, texts in zip(problems, completions)
    ]
    return GenerationResult(groups, time.perf_counter() - started, new_tokens)


def greedy_completions(policy: Policy, prompts: list[str], max_new_tokens: int) -> list[str]:
    """One greedy completion per prompt (pass@1 evaluation), cut at the closing </answer>."""
    tokenizer = policy.tokenizer
    tokenizer.padding_side = "left"
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    was_training = policy.model.training
    policy.model.eval()
    try:
        with torch.inference_mode():
            output = policy.model.generate(
                input_ids=encoded["input_ids"].to(policy.device),
                attention_mask=encoded["attention_mask"].to(policy.device),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                stop_strings=[ANSWER_CLOSE],
                tokenizer=tokenizer,
                pad_token_id=tokenizer.pad_token_id,
            )
    finally:
        if was_training:
            policy.model.train()
    texts = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
    return [_trim_after_answer(t) for t in texts]
