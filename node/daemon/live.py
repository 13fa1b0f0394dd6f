"""The running daemon's view of itself: which phase it is in, its network, and its node once the
model has loaded. It answers the page's `/api/status` and keeps DATA_DIR/status.json current for
`sapo-node status DATA_DIR`.

It is built once the network is up (a second after start), with the network: nothing in it is
None until filled. The one thing that comes later is the node, which takes minutes to load while
the page already answers; it arrives whole (`LoadedNode`: the node, its judge client, its state)
when it is ready, and until then the phase says the model is loading."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio

from sapo.node.core.metrics import RoundRecord
from sapo.node.core.settings import NodeSettings
from sapo.node.core.state import NodeState
from sapo.node.daemon.curves import RoundHistory
from sapo.node.daemon.status import (
    MAX_POINTS,
    JudgeStatus,
    NodeStatus,
    Phase,
    Progress,
    peer_rows,
    read_records,
    write_status_file,
)
from sapo.protocol.toolkit.release import sapo_version
from sapo.training.learning.warmstart import WarmStartProgress

if TYPE_CHECKING:
    from sapo.node.core.node import Node
    from sapo.node.judge.client import JudgeClient
    from sapo.protocol.network import NetworkStatus

log = logging.getLogger("sapo.node")

STATUS_FILE_EVERY_SECONDS = 5.0


class LoadingStopped(Exception):
    """Asked to stop (SIGINT/SIGTERM) while the model was still loading."""


class Watched(Protocol):
    """What the page reads of the network (protocol/network.py's `Network`)."""

    def status(self) -> NetworkStatus: ...


@dataclass
class LoadedNode:
    """The node once its model has loaded, with its judge client and the state after its last
    round: they exist together, so the page has all of them or none."""

    node: Node
    judge: JudgeClient | None
    state: NodeState


class LiveStatus:
    def __init__(
        self,
        settings: NodeSettings,
        peer_id: str,
        stop: threading.Event,
        network: Watched,
        *,
        listen: list[str],
        waiting: Callable[[], int],
    ):
        self.settings = settings
        self.peer_id = peer_id
        # Set by the signal handler; the warm start checks it after every step, and the phase
        # reads "stopping" once it is set.
        self.stop = stop
        self.network = network
        self.listen = listen
        # Received frames queued between the network and the (not yet started) intake.
        self.waiting = waiting
        self.started = time.time()
        self.phase: Phase = "starting"
        self.progress: Progress | None = None
        self.page: list[str] = []  # the page's addresses, once it serves (it serves this object)
        self.loaded: LoadedNode | None = None  # while the model loads: the phase says so
        self._history = RoundHistory()  # bounded: bins of rounds, not every round

    # --- what the daemon tells it ----------------------------------------------------------

    def warm_start_step(self, progress: WarmStartProgress) -> None:
        """The warm start's watcher; runs in the loading worker thread."""
        if self.stop.is_set():
            raise LoadingStopped("stopped during the warm start; nothing was cached, the next start begins it again")
        self.phase = "warm start" if progress.step < progress.total else "loading model"
        self.progress = Progress(
            what="warm start",
            done=progress.step,
            total=progress.total,
            elapsed_seconds=progress.elapsed,
            seconds_left=progress.seconds_left,
        )

    def node_ready(self, loaded: LoadedNode) -> None:
        """The node exists: its past rounds (a resumed node's) join the curves."""
        self.loaded = loaded
        self.progress = None
        self._history = RoundHistory(r for r in read_records(loaded.node.data_dir) if r.round <= loaded.state.round)

    def after_round(self, state: NodeState, record: RoundRecord) -> None:
        """The round loop's after-round call: the curves grow, and the judge hears of it."""
        assert self.loaded is not None, "rounds run only once the node has loaded"
        self.loaded.state = state
        self._history.add(record)
        if self.loaded.judge is not None:
            self.loaded.judge.round_done(record)

    def current_phase(self) -> Phase:
        if self.stop.is_set() and self.phase not in ("finished", "stopped"):
            return "stopping"
        return self.phase

    # --- what it answers -------------------------------------------------------------------

    def snapshot(self) -> NodeStatus:
        loaded = self.loaded
        status = NodeStatus(
            source="live",
            updated=time.time(),
            pid=os.getpid(),
            version=sapo_version(),
            peer_id=self.peer_id,
            model=self.settings.model.model,
            data_dir=str(self.settings.run.data_dir),
            phase=self.current_phase(),
            progress=self.progress,
            started=self.started,
            listen=self.listen,
            page=self.page,
            rounds_planned=self.settings.run.rounds,
            waiting_while_loading=self.waiting(),
            judge=self._judge(),
        )
        update: dict = {}
        seen = self.network.status()
        transport = seen.counters
        if loaded is not None:
            counters = loaded.node.counters
            update |= {
                "round": loaded.state.round,
                "cumulative_reward": loaded.state.cumulative_reward,
                "inbox_size": len(loaded.node.inbox),
                "received": counters.received,
                "accepted": counters.accepted,
                "rejected": counters.all_rejections(),
                "logprobs": dict(counters.logprobs),
            }
            accepted_from = dict(counters.accepted_from)
        else:
            accepted_from = {}
        update |= {
            "dropped": transport.get("inbox_channel_full", 0),
            "peers_banned": transport.get("peers_banned", 0),
            "transport": dict(transport),
            "bans": seen.bans,
            "peers": peer_rows(seen.connected, seen.addresses, accepted_from, seen.bans, seen.agents, seen.scores),
        }
        update |= self._history.fields()
        return status.model_copy(update=update)

    def _judge(self) -> JudgeStatus | None:
        address = self.settings.run.judge
        if not address:
            return None
        judge = self.loaded.judge if self.loaded is not None else None
        if judge is None:
            return JudgeStatus(address=address, every=self.settings.run.judge_every)
        scores = list(judge.scores)
        return JudgeStatus(
            address=address,
            every=judge.every,
            last_round=scores[-1][0] if scores else None,
            last_score=scores[-1][1] if scores else None,
            judged=judge.judged,
            mean_score=judge.score_sum / judge.judged if judge.judged else None,
            scores=scores[-MAX_POINTS:],
            failures={k: v for k, v in judge.counters.items() if k != "judged"},
        )

    # --- the status file -------------------------------------------------------------------

    def write_file(self) -> None:
        try:
            write_status_file(self.settings.run.data_dir, self.snapshot())
        except OSError as error:  # a full disk must not stop training; the page still works
            log.warning("could not write %s: %s", self.settings.run.data_dir / "status.json", error)

    async def keep_file(self, every: float = STATUS_FILE_EVERY_SECONDS) -> None:
        while True:
            self.write_file()
            await trio.sleep(every)
