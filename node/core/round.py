"""What one SAPO round does, start to finish: the one copy of it, for the daemon, the study
harness and the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from sapo.node.core.metrics import RoundRecord
from sapo.node.core.node import Node
from sapo.node.core.state import NodeState, RandomStreams
from sapo.sampling.balance import RoundPlan
from sapo.sampling.training_set import TrainingSet
from sapo.training.completions.generation import GenerationResult
from sapo.training.learning.update import UpdateStats
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
    record = node.summarize(state, plan, generation, training_set, update, seconds, exchange.peers(), heldout)
    await trio.to_thread.run_sync(node.metrics.append, record)  # fsyncs, and now and then compacts the history
    selection = screening.selection  # the screen's redraws included
    streams = RandomStreams(tasks=tasks, mix=selection.rng, update=update_rng)
    state = node.next_state(state, plan, record, selection, training_set, streams)
    if node.checkpoint_due(plan.index):
        async with torch_lock:
            await trio.to_thread.run_sync(node.checkpoint, state)
    return RoundResult(plan, generation, training_set, update, record, state)
