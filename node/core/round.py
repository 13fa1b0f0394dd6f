"""What one SAPO round does, start to finish: the one copy of it, for the daemon, the study
harness and the benchmarks."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from sapo.node.core.metrics import RoundRecord
from sapo.node.core.node import Node
from sapo.node.core.state import NodeState, RandomStreams
from sapo.sampling.balance import RoundPlan
from sapo.sampling.training_set import TrainingSet
from sapo.training.completions.evaluation import HeldOutScores
from sapo.training.completions.generation import GenerationResult
from sapo.training.learning.update import UpdateStats
from sapo.training.problems.rewards import has_answer_tag, is_correct
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import Problem


class Exchange(Protocol):
    """Where rollouts go out and which peers are connected; incoming groups reach the inbox
    through the exchange's own receive path. Gossip (exchange.py) and the in-process hub
    (memory_exchange.py) both satisfy it."""

    async def publish(self, groups: list[QuestionGroup], round_index: int) -> None: ...

    def peers(self) -> list[str]: ...


@dataclass(frozen=True)
class RoundResult:
    """Everything a round produced, handed out for whoever ran it to look at, and the node's
    state after it: what the next round starts from."""

    plan: RoundPlan
    generation: GenerationResult
    training_set: TrainingSet
    update: UpdateStats | None
    record: RoundRecord
    state: NodeState


async def generate_alone(
    node: Node, plan: RoundPlan, questions: list[Problem], torch_lock: trio.Lock
) -> GenerationResult:
    """A node's generation of the round's questions on its own: in a worker thread, holding the torch lock."""
    async with torch_lock:
        return await trio.to_thread.run_sync(node.generate, plan, questions)


Generate = Callable[[Node, RoundPlan, list[Problem], trio.Lock], Awaitable[GenerationResult]]


async def run_round(
    node: Node,
    state: NodeState,
    exchange: Exchange,
    torch_lock: trio.Lock,
    clock: Callable[[], float] = time.time,
    generate: Generate = generate_alone,
) -> RoundResult:
    """Plan the round from the node's state, sample tasks and generate G completions each (local
    rollouts), publish them, mix in J external groups from the inbox, screen them (drawing again
    for the groups the screen refused), re-encode and take the GRPO step, measure held-out
    accuracy when due, then record the round and hand out the state it leaves.

    Torch work runs in a worker thread so the network keeps breathing; `torch_lock` keeps
    other torch users (the judge, other nodes of a study) off the CPU meanwhile. `clock` is
    what "now" means for the inbox (the study's round clock, or the wall clock). `generate` is
    how the round's local groups are made: the node alone, or batched with other nodes on one
    shared base (node/study/shared_generation.py).
    """
    started = time.perf_counter()
    plan = node.plan(state)
    questions, tasks = node.questions(plan, state.streams.tasks)
    generation = await generate(node, plan, questions, torch_lock)
    await exchange.publish(generation.groups, plan.index)
    now = clock()
    selection = node.mix(plan, state, now)
    node.inbox.take(selection.external)  # a group trains once
    async with torch_lock:
        screening = await trio.to_thread.run_sync(node.screen, plan, generation, selection, state, now)
        training_set = await trio.to_thread.run_sync(node.prepare, plan, generation, screening)
        update, update_rng = await trio.to_thread.run_sync(node.train, training_set, state.streams.update)
    heldout = None
    if node.evaluation_due(plan.index):
        async with torch_lock:
            heldout = await trio.to_thread.run_sync(node.evaluate, plan.index)
    seconds = time.perf_counter() - started
    record = summarize(node, state, plan, generation, training_set, update, seconds, exchange.peers(), heldout)
    await trio.to_thread.run_sync(node.metrics.append, record)  # fsyncs, and now and then compacts the history
    selection = screening.selection  # the screen's redraws included
    streams = RandomStreams(tasks=tasks, mix=selection.rng, update=update_rng)
    state = node.next_state(state, plan, record, selection, training_set, streams)
    if node.checkpoint_due(plan.index):
        async with torch_lock:
            await trio.to_thread.run_sync(node.checkpoint, state)
    return RoundResult(plan, generation, training_set, update, record, state)


def summarize(
    node: Node,
    state: NodeState,
    plan: RoundPlan,
    generation: GenerationResult,
    training: TrainingSet,
    update: UpdateStats | None,
    round_seconds: float,
    peers: list[str],
    heldout: HeldOutScores | None = None,
) -> RoundRecord:
    """What `node`'s round did, as one metrics record; changes nothing."""
    rewards = [r for g in generation.groups for r in g.rewards]
    completions = [c for g in generation.groups for c in g.completions]
    reward_mean = sum(rewards) / len(rewards) if rewards else 0.0
    by_task: dict[str, list[float]] = {}
    for g in generation.groups:
        by_task.setdefault(g.problem.spec.dataset, []).extend(g.rewards)
    external = [r for g in training.external for r in g.rewards]
    trained = update is not None and not update.skipped
    return RoundRecord(
        round=plan.index,
        time=time.time(),
        reward_mean=reward_mean,
        cumulative_reward=state.cumulative_reward + reward_mean,
        format_rate=sum(map(has_answer_tag, completions)) / len(completions) if completions else 0.0,
        accuracy=sum(map(is_correct, rewards)) / len(rewards) if rewards else 0.0,
        heldout=heldout.greedy if heldout else None,
        heldout_sampled=heldout.sampled if heldout else None,
        per_task={k: sum(v) / len(v) for k, v in sorted(by_task.items())},
        asked=[f"{g.problem.spec.dataset}#{g.problem.spec.index}" for g in generation.groups],
        local_groups=len(training.local),
        external_planned=plan.external,
        external_groups=len(training.external),
        external_reward_mean=sum(external) / len(external) if external else None,
        screened_out=len(training.refused),
        screen_redrawn=training.redrawn,
        external_from=dict(Counter(g.origin for g in [*training.external, *training.refused])),
        screened_completions=training.screened_completions,
        screen_seconds=training.screen_seconds,
        inbox_size=len(node.inbox),
        received=node.counters.received,
        accepted=node.counters.accepted,
        rejected=node.counters.all_rejections(),
        transport=dict(node.counters.transport),
        accepted_from=dict(node.counters.accepted_from),
        published=node.counters.published,
        peers=peers,
        generate_seconds=generation.seconds,
        train_seconds=update.seconds if update else 0.0,
        round_seconds=round_seconds,
        generated_tokens=generation.new_tokens,
        augment_tokens=training.augment_tokens,
        update_tokens=update.tokens if update else 0,
        tokens_per_second=generation.new_tokens / generation.seconds if generation.seconds > 0 else 0.0,
        loss=update.loss if update is not None and trained else None,
        clip_fraction=update.clip_fraction if update is not None and trained else None,
    )
