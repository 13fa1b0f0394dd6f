"""The running daemon's view of itself: which phase it is in, and the live objects (gossip
service, node, judge client) as each comes to exist. It answers the page's `/api/status`
and keeps DATA_DIR/status.json current for `sapo-node status DATA_DIR`."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

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
    from sapo.protocol.network import Network

log = logging.getLogger("sapo.node")

STATUS_FILE_EVERY_SECONDS = 5.0


class LoadingStopped(Exception):
    """Asked to stop (SIGINT/SIGTERM) while the model was still loading."""


class LiveStatus:
    def __init__(self, settings: NodeSettings, peer_id: str, stop: threading.Event):
        self.settings = settings
        self.peer_id = peer_id
        # Set by the signal handler; the warm start checks it after every step.
        self.stop = stop
        self.started = time.time()
        self.phase: Phase = "starting"
        self.progress: Progress | None = None
        self.listen: list[str] = []
        self.page: list[str] = []
        self.network: Network | None = None  # once open_network has it up
        self.node: Node | None = None
        self.state: NodeState | None = None  # after the last round done
        self.judge: JudgeClient | None = None
        # Received frames queued between the network and the (not yet started) intake.
        self.waiting: Callable[[], int] = lambda: 0
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

    def node_ready(self, node: Node, state: NodeState) -> None:
        """The node exists: its past rounds (a resumed node's) join the curves."""
        self.node = node
        self.state = state
        self.progress = None
        self._history = RoundHistory(r for r in read_records(node.data_dir) if r.round <= state.round)

    def after_round(self, state: NodeState, record: RoundRecord) -> None:
        """The round loop's after-round call: the curves grow, and the judge hears of it."""
        self.state = state
        self._history.add(record)
        if self.judge is not None:
            self.judge.round_done(record)

    # --- what it answers -------------------------------------------------------------------

    def snapshot(self) -> NodeStatus:
        node, network = self.node, self.network
        status = NodeStatus(
            source="live",
            updated=time.time(),
            pid=os.getpid(),
            version=sapo_version(),
            peer_id=self.peer_id,
            model=self.settings.model.model,
            data_dir=str(self.settings.run.data_dir),
            phase=self.phase,
            progress=self.progress,
            started=self.started,
            listen=self.listen,
            page=self.page,
            rounds_planned=self.settings.run.rounds,
            waiting_while_loading=self.waiting(),
            judge=self._judge(),
        )
        update: dict = {}
        seen = network.status() if network is not None else None
        transport = seen.counters if seen is not None else {}
        if node is not None and self.state is not None:  # set together, by node_ready
            counters = node.counters
            update |= {
                "round": self.state.round,
                "cumulative_reward": self.state.cumulative_reward,
                "inbox_size": len(node.inbox),
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
        }
        if seen is not None:
            update |= {
                "bans": seen.bans,
                "peers": peer_rows(seen.connected, seen.addresses, accepted_from, seen.bans, seen.agents, seen.scores),
            }
        update |= self._history.fields()
        return status.model_copy(update=update)

    def _judge(self) -> JudgeStatus | None:
        address = self.settings.run.judge
        if not address:
            return None
        judge = self.judge
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
