"""Sampling G completions per question from the node's own policy."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sapo.training.decoding import GenerationInterrupted, decode_samples
from sapo.training.policy import Policy
from sapo.training.rewards import Verifier, score_group
from sapo.training.rollouts import Behavior, QuestionGroup
from sapo.training.tasks import Problem

__all__ = ["ANSWER_CLOSE", "GenerationInterrupted", "GenerationResult", "generate_groups", "greedy_completions", "sample_completions"]

ANSWER_CLOSE = "</answer>"


@dataclass(frozen=True)
class GenerationResult:
    groups: list[QuestionGroup]
    seconds: float  # sampling and scoring
    new_tokens: int
    cpu_seconds: float = 0.0  # process CPU time over the whole step


def sample_completions(
    policy: Policy,
    prompts: list[str],
    *,
    num_generations: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    stop: threading.Event | None = None,
    record_logprobs: bool = False,
) -> tuple[list[list[str]], int, list[list[list[float]]] | None]:
    """All questions x G samples in one batch, with a KV cache and left padding.

    Each sequence stops at EOS or at the closing </answer>; the decoded text keeps the tag.
    Returns the completions per prompt, the number of generated tokens, and with
    `record_logprobs` each completion's token log-probs per prompt (None for a completion whose
    text, cut after the tag, no longer encodes to the tokens sampled: they could not be compared).
    """
    decoded = decode_samples(
        policy.model,
        policy.tokenizer,
        prompts,
        samples_per_prompt=num_generations,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        device=policy.device,
        stop_text=ANSWER_CLOSE,
        stop=stop,
        autocast=policy.autocast,
        weights_dtype=policy.generation_dtype,
        record_logprobs=record_logprobs,
    )
    texts = [_trim_after_answer(t) for t in policy.tokenizer.batch_decode(decoded.token_ids, skip_special_tokens=True)]
    grouped = [texts[i * num_generations : (i + 1) * num_generations] for i in range(len(prompts))]
    if decoded.token_logprobs is None:
        return grouped, decoded.new_tokens, None
    encoded = policy.tokenizer(texts, add_special_tokens=False)["input_ids"]
    rows = [lp if list(ids) == tokens else None
            for lp, ids, tokens in zip(decoded.token_logprobs, encoded, decoded.token_ids)]
    return grouped, decoded.new_tokens, [rows[i * num_generations : (i + 1) * num_generations] for i in range(len(prompts))]


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
    verifier: Verifier = score_group,
    record_behavior: bool = False,
) -> GenerationResult:
    """This round's local rollouts: sampled, decoded and scored by this node's verifier.

    With `record_behavior`, each group carries the token log-probs it was sampled with (its
    `behavior`, which --share-logprobs publishes), where every completion's can be compared."""
    if not problems:
        return GenerationResult([], 0.0, 0)
    started, cpu_started = time.perf_counter(), time.process_time()
    prompts = [policy.prompt(p) for p in problems]
    completions, new_tokens, logprobs = sample_completions(
        policy,
        prompts,
        num_generations=num_generations,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        stop=stop,
        record_logprobs=record_behavior,
    )
    now = time.time()
    groups = [
        QuestionGroup(
            problem=problem,
            completions=texts,
            rewards=verifier(problem, texts),
            model_id=policy.model_id,
            sender_round=sender_round,
            created_at=now,
            behavior=_behavior(policy, temperature, logprobs[i]) if logprobs is not None else None,
        )
        for i, (problem, texts) in enumerate(zip(problems, completions))
    ]
    return GenerationResult(groups, time.perf_counter() - started, new_tokens, time.process_time() - cpu_started)


def _behavior(policy: Policy, temperature: float, rows: list[list[float] | None]) -> Behavior | None:
    # One row that cannot be compared drops the group's: the wire field is all or nothing.
    if any(row is None for row in rows):
        return None
    return Behavior(tokenizer=policy.tokenizer_fingerprint, temperature=temperature, token_logprobs=rows)


def greedy_completions(policy: Policy, prompts: list[str], max_new_tokens: int) -> list[str]:
    """One greedy completion per prompt (pass@1 evaluation), cut at the closing </answer>."""
    decoded = decode_samples(
        policy.model,
        policy.tokenizer,
        prompts,
        samples_per_prompt=1,
        max_new_tokens=max_new_tokens,
        temperature=None,
        seed=0,
        device=policy.device,
        stop_text=ANSWER_CLOSE,
        autocast=policy.autocast,
        weights_dtype=policy.generation_dtype,
    )
    return [_trim_after_answer(t) for t in policy.tokenizer.batch_decode(decoded.token_ids, skip_special_tokens=True)]
