"""What one SAPO round does, start to finish."""

from __future__ import annotations

import time
from typing import Protocol

import trio

from sapo.node.core import Node
from sapo.node.metrics import RoundRecord
from sapo.training.rollouts import QuestionGroup


class Exchange(Protocol):
    """Where rollouts go out and which peers are connected; incoming groups reach the inbox
    through the exchange's own receive path."""

    async def publish(self, groups: list[QuestionGroup], round_index: int) -> None: ...

    def peers(self) -> list[str]: ...


async def run_round(node: Node, exchange: Exchange, round_index: int, torch_lock: trio.Lock) -> RoundRecord:
    """Sample tasks and generate G completions each (local rollouts), publish them, mix in J
    external groups from the inbox, re-encode and take one GRPO step, then record the round.

    Torch work runs in a worker thread so the network keeps breathing; `torch_lock` keeps
    other torch users (the judge, say) off the model meanwhile.
    """
    started = time.perf_counter()
    async with torch_lock:
        generation = await trio.to_thread.run_sync(node.generate, round_index)
    await exchange.publish(generation.groups, round_index)
    training_set = node.mix(generation)
    async with torch_lock:
        update = await trio.to_thread.run_sync(node.train, training_set)
    record = node.record(
        round_index, generation, training_set, update, time.perf_counter() - started, exchange.peers()
    )
    if round_index % node.settings.run.checkpoint_every == 0:
        async with torch_lock:
            await trio.to_thread.run_sync(node.checkpoint)
    return record
