"""One mixed batch for the round's generation of every node on one shared base.

With `--shared-base` the learners of a run are LoRA adapters of one base model
(training/models/shared_base.py). Each learner's `run_round` hands its generation here instead of
generating alone; once every learner taking part in the round has asked, the last one to ask
samples all of them as one batch through the base weights, and each gets back what its own
policy sampled with its own seed.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from sapo.node.core.node import Node
from sapo.sampling.balance import RoundPlan
from sapo.training.completions.generation import GenerationResult, generate_groups_together
from sapo.training.problems.tasks import Problem


class BatchedGeneration:
    def __init__(self, learners_in_round: Callable[[int], int]):
        self.learners_in_round = learners_in_round
        self._asked: dict[int, list[tuple[Node, RoundPlan, list[Problem]]]] = {}
        self._ready: dict[int, trio.Event] = {}
        self._results: dict[int, dict[int, GenerationResult]] = {}

    async def generate(
        self, node: Node, plan: RoundPlan, questions: list[Problem], torch_lock: trio.Lock
    ) -> GenerationResult:
        """`run_round`'s generate step: this node's groups, sampled in the round's one batch."""
        round_index = plan.index
        asked = self._asked.setdefault(round_index, [])
        ready = self._ready.setdefault(round_index, trio.Event())
        asked.append((node, plan, questions))
        if len(asked) < self.learners_in_round(round_index):
            await ready.wait()
        else:
            del self._asked[round_index]
            async with torch_lock:
                generated = await trio.to_thread.run_sync(generate_round, asked)
            self._results[round_index] = {id(n): r for (n, _, _), r in zip(asked, generated)}
            del self._ready[round_index]
            ready.set()
        results = self._results[round_index]
        mine = results.pop(id(node))
        if not results:
            del self._results[round_index]
        return mine


def generate_round(asked: list[tuple[Node, RoundPlan, list[Problem]]]) -> list[GenerationResult]:
    """Every asking node's round, as one batch (in seed order, whatever order they asked in, so
    the batch is the same from run to run)."""
    ordered = sorted(range(len(asked)), key=lambda i: asked[i][0].settings.seed)
    settings = asked[0][0].training
    if any(
        n.training.generations != settings.generations
        or n.training.max_new_tokens != settings.max_new_tokens
        or n.training.temperature != settings.temperature
        for n, _, _ in asked
    ):
        raise ValueError("nodes on one shared base sample with one --generations, --max-new-tokens and --temperature")
    requests = [asked[i][0].generation_request(asked[i][1], asked[i][2]) for i in ordered]
    results = generate_groups_together(
        requests,
        num_generations=settings.generations,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        stop=asked[0][0].stop_requested,
    )
    position_of = {i: position for position, i in enumerate(ordered)}
    return [results[position_of[i]] for i in range(len(asked))]
