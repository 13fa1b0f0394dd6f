"""Sampling G completions per question from the node's own policy."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sapo.training.decoder.decoding import DecodedBatch, GenerationInterrupted, decode_mixed, decode_samples
from sapo.training.models.policy import Policy
from sapo.training.problems.rewards import Verifier, score_group
from sapo.training.problems.rollouts import Behavior, QuestionGroup
from sapo.training.problems.tasks import Problem

__all__ = [
    "ANSWER_CLOSE",
    "GenerationInterrupted",
    "GenerationRequest",
    "GenerationResult",
    "generate_groups",
    "generate_groups_together",
    "greedy_completions",
    "sample_completions",
    "sample_completions_together",
]

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
    return _completions(policy, decoded, num_generations, len(prompts))


def _completions(policy: Policy, decoded: DecodedBatch, num_generations: int, prompts: int):
    """sample_completions' result from a decoded batch: texts cut after the tag, grouped per prompt."""
    texts = [_trim_after_answer(t) for t in policy.tokenizer.batch_decode(decoded.token_ids, skip_special_tokens=True)]
    grouped = [texts[i * num_generations : (i + 1) * num_generations] for i in range(prompts)]
    if decoded.token_logprobs is None:
        return grouped, decoded.new_tokens, None
    encoded = policy.tokenizer(texts, add_special_tokens=False)["input_ids"]
    rows = [
        lp if list(ids) == tokens else None
        for lp, ids, tokens in zip(decoded.token_logprobs, encoded, decoded.token_ids)
    ]
    return grouped, decoded.new_tokens, [rows[i * num_generations : (i + 1) * num_generations] for i in range(prompts)]


def sample_completions_together(
    policies: list[Policy],
    prompts: list[list[str]],
    *,
    seeds: list[int],
    num_generations: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    stop: threading.Event | None = None,
    record_logprobs: bool = False,
) -> list[tuple[list[list[str]], int, list[list[list[float]]] | None]]:
    """sample_completions for several policies that are adapters of one shared base
    (training/models/shared_base.py), as one mixed batch: each policy's result as it would be alone.
    Policies that do not share one base, or a model LlamaDecoder cannot run, decode one by one."""
    from sapo.training.models.shared_base import AdapterView

    views = [p.model for p in policies if isinstance(p.model, AdapterView)]
    if len(views) == len(policies) and len({id(v.shared) for v in views}) == 1:
        first = policies[0]
        decoded = decode_mixed(
            views[0].shared,
            first.tokenizer,
            prompts,
            [v.name for v in views],
            seeds=seeds,
            samples_per_prompt=num_generations,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            device=first.device,
            stop_text=ANSWER_CLOSE,
            stop=stop,
            weights_dtype=first.generation_dtype,
            record_logprobs=record_logprobs,
        )
        if decoded is not None:
            return [_completions(p, d, num_generations, len(ps)) for p, d, ps in zip(policies, decoded, prompts)]
    return [
        sample_completions(
            p,
            ps,
            num_generations=num_generations,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            stop=stop,
            record_logprobs=record_logprobs,
        )
        for p, ps, seed in zip(policies, prompts, seeds)
    ]


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
    groups = _groups(policy, problems, completions, logprobs, verifier, sender_round, temperature)
    return GenerationResult(groups, time.perf_counter() - started, new_tokens, time.process_time() - cpu_started)


@dataclass(frozen=True)
class GenerationRequest:
    """One node's generate_groups arguments, for generate_groups_together."""

    policy: Policy
    problems: list[Problem]
    seed: int
    sender_round: int
    verifier: Verifier = score_group
    record_behavior: bool = False


def generate_groups_together(
    requests: list[GenerationRequest],
    *,
    num_generations: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    stop: threading.Event | None = None,
) -> list[GenerationResult]:
    """generate_groups for several nodes on one shared base, sampled as one mixed batch
    (sample_completions_together); each result's seconds are the whole batch's."""
    started, cpu_started = time.perf_counter(), time.process_time()
    asking = [r for r in requests if r.problems]
    sampled = sample_completions_together(
        [r.policy for r in asking],
        [[r.policy.prompt(p) for p in r.problems] for r in asking],
        seeds=[r.seed for r in asking],
        num_generations=num_generations,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        stop=stop,
        record_logprobs=any(r.record_behavior for r in asking),
    )
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    by_request = dict(zip(map(id, asking), sampled))
    results = []
    for r in requests:
        if not r.problems:
            results.append(GenerationResult([], 0.0, 0))
            continue
        completions, new_tokens, logprobs = by_request[id(r)]
        groups = _groups(
            r.policy,
            r.problems,
            completions,
            logprobs if r.record_behavior else None,
            r.verifier,
            r.sender_round,
            temperature,
        )
        results.append(GenerationResult(groups, seconds, new_tokens, cpu))
    return results


def _groups(
    policy: Policy,
    problems: list[Problem],
    completions,
    logprobs,
    verifier: Verifier,
    sender_round: int,
    temperature: float,
) -> list[QuestionGroup]:
    now = time.time()
    return [
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
