"""How late our own trio loop runs: the one sign of overload a service should act on (issue #41).

A request that times out says that *some* loop was too slow: ours, the peer's, or neither (a peer
that holds its stream open on purpose). Only ours is a reason to do less, so the fetcher asks this
probe, not its timeouts, whether to stop dialling. The probe sleeps PROBE_SECONDS over and over
and notes how late it wakes; a wake-up BEHIND_SECONDS late or more marks the loop as behind for
MEMORY_SECONDS after. A GRPO step in a worker thread delays the loop by milliseconds
(docs/bench/gossip-during-update.md); a loop that wakes half a second late is starved of CPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import trio

PROBE_SECONDS = 0.1
BEHIND_SECONDS = 0.5
MEMORY_SECONDS = 10.0


class LoopLag:
    """`run()` it in a nursery; `behind()` says whether the loop woke BEHIND_SECONDS late in the
    last MEMORY_SECONDS. Never run, it is never behind."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.worst = 0.0  # the latest wake-up seen, in seconds past the probe's sleep
        self._behind_until = -math.inf

    async def run(self) -> None:
        while True:
            before = self.clock()
            await trio.sleep(PROBE_SECONDS)
            self.note(self.clock() - before - PROBE_SECONDS)

    def note(self, late: float) -> None:
        """One wake-up, `late` seconds past its time."""
        self.worst = max(self.worst, late)
        if late >= BEHIND_SECONDS:
            self._behind_until = self.clock() + MEMORY_SECONDS

    def behind(self) -> bool:
        return self.clock() < self._behind_until
