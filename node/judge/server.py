"""`sapo-node judge`: the open judge. It asks nodes held-out ReasoningGYM questions over
`/sapo/judge/1` and keeps every verifier score in SQLite.

One evaluation is one stream, opened by the node (wire format: protocol/judge_wire.py):
EvalRequest -> Question -> Answer -> Score. The judge regenerates the problem from its own spec
and scores the answer with the task's verifier (training.rewards.score_completion); the node
never sees the answer key. The result row is committed before the Score is sent, so a node
that saw its score can find it in the database, across judge restarts.

The judge is one trio nursery: the libp2p host (Noise only, yamux) whose stream handler runs
one task per evaluation, and SQLite writes in worker threads behind one lock.
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import multiaddr
import trio

from sapo.protocol import judge_wire as wire
from sapo.protocol.hosts import new_noise_host
from sapo.protocol.identity import load_or_create_identity, peer_id_of
from sapo.protocol.messages import WireProblemSpec
from sapo.training.rewards import score_completion
from sapo.node.judge.settings import JudgeSettings
from sapo.training.tasks import EASY_CONFIGS, ProblemSpec, generate_problem

log = logging.getLogger("sapo.judge")

DB_FILE_NAME = "judge.sqlite"
# Bump with a migration in ResultStore._migrate when the table changes.
DB_SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    question_id      TEXT    NOT NULL UNIQUE,  -- the Question.id sent to the node
    peer_id          TEXT    NOT NULL,         -- authenticated by Noise, not just claimed
    model_id         TEXT    NOT NULL,         -- claimed by the node
    node_round       INTEGER NOT NULL,         -- claimed by the node
    swarm_peers_seen INTEGER NOT NULL,         -- claimed by the node
    external_groups  INTEGER NOT NULL,         -- claimed by the node
    task             TEXT    NOT NULL,         -- ReasoningGYM dataset name
    spec             TEXT    NOT NULL,         -- the problem's ProblemSpec as JSON
    answer           TEXT    NOT NULL,         -- the node's completion, as received
    score            REAL    NOT NULL,         -- verifier score in [0, 1]
    judged_at        REAL    NOT NULL          -- unix seconds
);
CREATE INDEX IF NOT EXISTS results_by_peer ON results (peer_id, node_round);
"""


@dataclass(frozen=True)
class JudgeResult:
    question_id: str
    peer_id: str
    model_id: str
    node_round: int
    swarm_peers_seen: int
    external_groups: int
    task: str
    spec: str
    answer: str
    score: float
    judged_at: float


class ResultStore:
    """The results table. Thread-safe: the judge calls `add` from worker threads, one at a time."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        # WAL: the report can read while the judge writes. synchronous=FULL: a committed result
        # survives a power cut too, not only a crash; at a few results a second it costs nothing.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._migrate()

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > DB_SCHEMA_VERSION:
            raise ValueError(
                f"{self.path} has schema version {version}, this judge knows {DB_SCHEMA_VERSION}; upgrade sapo"
            )
        self._db.executescript(SCHEMA)
        self._db.execute(f"PRAGMA user_version={DB_SCHEMA_VERSION}")

    def add(self, result: JudgeResult) -> int:
        """Insert and commit one result; returns the table's row count."""
        with self._lock:
            with self._db:  # BEGIN ... COMMIT, or ROLLBACK on error
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute(
                    "INSERT INTO results (question_id, peer_id, model_id, node_round, swarm_peers_seen,"
                    " external_groups, task, spec, answer, score, judged_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        result.question_id, result.peer_id, result.model_id, result.node_round,
                        result.swarm_peers_seen, result.external_groups, result.task, result.spec,
                        result.answer, result.score, result.judged_at,
                    ),
                )
            return self.count()

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def load_results(db_path: Path) -> list[dict[str, Any]]:
    """Every result row, oldest first, as dicts (for the report and tests)."""
    if not Path(db_path).is_file():
        raise FileNotFoundError(f"{db_path} does not exist; give the judge's --data-dir")
    db = sqlite3.connect(db_path)
    try:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute("SELECT * FROM results ORDER BY id")]
    finally:
        db.close()


class JudgeService:
    """The `/sapo/judge/1` stream handler and the host it runs on."""

    def __init__(self, settings: JudgeSettings, key_pair: Any, store: ResultStore):
        self.settings = settings
        self.key_pair = key_pair
        self.store = store
        self.counters: dict[str, int] = {}
        self._host: Any = None
        self._slots = trio.Semaphore(settings.max_concurrent)
        # Restarting with the same seed must not replay the same questions in the same order.
        self._rng = random.Random(settings.seed * 1_000_003 + store.count())
        self._next_index = store.count()

    @property
    def peer_id(self) -> str:
        return peer_id_of(self.key_pair)

    @property
    def listen_addrs(self) -> list[str]:
        return [] if self._host is None else [str(a) for a in self._host.get_addrs()]

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _next_spec(self) -> ProblemSpec:
        task = self._rng.choice(self.settings.tasks)
        spec = ProblemSpec(dataset=task, config=EASY_CONFIGS[task], seed=self.settings.seed, index=self._next_index)
        self._next_index += 1
        return spec

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listen = multiaddr.Multiaddr(self.settings.listen)
        host = new_noise_host(self.key_pair, [listen])
        host.set_stream_handler(wire.PROTOCOL_ID, self.handle)
        try:
            async with host.run([listen]):
                self._host = host
                try:
                    task_status.started()
                    await trio.sleep_forever()
                finally:
                    # close() can hang on a crashed peer; bound it (see protocol/gossip.py).
                    with trio.move_on_after(self.settings.close_timeout_seconds) as scope:
                        scope.shield = True
                        await host.close()
        finally:
            self._host = None

    async def handle(self, stream: Any) -> None:
        """One evaluation. Never raises: a bad or slow peer costs its own stream, not the judge."""
        try:
            remote = stream.muxed_conn.peer_id.to_base58()
        except Exception:  # noqa: BLE001
            remote = "?"
        try:
            if self._slots.value == 0:
                self._count("busy")
                await self._send_error(stream, "busy", f"{self.settings.max_concurrent} evaluations in flight; retry later")
                return
            async with self._slots:
                await self._evaluate(stream, remote)
        except wire.JudgeWireError as error:
            self._count(error.reason.value)
            log.warning("refused %s: %s", remote, error)
            await self._send_error(stream, error.reason.value, error.detail)
        except trio.TooSlowError:
            self._count("timeout")
            log.warning("evaluation of %s timed out", remote)
            await self._send_error(stream, "timeout", "the judge waited too long for your next frame")
        except Exception as error:  # noqa: BLE001 - a judge bug or a dead stream must not stop the judge
            self._count("failed")
            log.warning("evaluation of %s failed: %s: %s", remote, type(error).__name__, error)
        finally:
            with trio.move_on_after(self.settings.close_timeout_seconds) as scope:
                scope.shield = True
                try:
                    await stream.close()
                except Exception:  # noqa: BLE001
                    pass

    async def _evaluate(self, stream: Any, remote: str) -> None:
        s = self.settings
        with trio.fail_after(s.request_timeout_seconds):
            request = await wire.read_message(stream, wire.EvalRequest, s.max_frame_bytes)
        if request.peer_id != remote:
            raise wire.JudgeWireError(
                wire.WireErrorReason.peer_mismatch,
                f"peer_id {request.peer_id[:60]!r} is not the connected peer {remote}; send your own peer id",
            )
        spec = self._next_spec()
        problem = await trio.to_thread.run_sync(generate_problem, spec)
        question = wire.Question(
            id=secrets.token_hex(8),
            task=spec.dataset,
            question=problem.question,
            spec=WireProblemSpec.from_spec(spec),
        )
        with trio.fail_after(s.request_timeout_seconds):
            await wire.write_message(stream, question, s.max_frame_bytes)
        with trio.fail_after(s.answer_timeout_seconds):
            answer = await wire.read_message(stream, wire.Answer, s.max_frame_bytes)
        if answer.id != question.id:
            raise wire.JudgeWireError(
                wire.WireErrorReason.wrong_question, f"answer to {answer.id!r}, but the question was {question.id!r}"
            )
        score = await trio.to_thread.run_sync(score_completion, problem, answer.text)
        result = JudgeResult(
            question_id=question.id,
            peer_id=remote,
            model_id=request.model_id,
            node_round=request.node_round,
            swarm_peers_seen=request.swarm_peers_seen,
            external_groups=request.external_groups,
            task=spec.dataset,
            spec=json.dumps(spec.model_dump(), sort_keys=True),
            answer=answer.text,
            score=score,
            judged_at=time.time(),
        )
        # Committed before the reply: a Score the node saw is never lost. Shielded so a
        # shutdown mid-write cannot leave the thread writing after we give up on it.
        with trio.CancelScope(shield=True):
            total = await trio.to_thread.run_sync(self.store.add, result)
        self._count("judged")
        log.info(
            "judged %s round %d: %s score %.2f (peers seen %d; %d results stored)",
            remote, request.node_round, spec.dataset, score, request.swarm_peers_seen, total,
        )
        with trio.fail_after(s.request_timeout_seconds):
            await wire.write_message(stream, wire.Score(id=question.id, score=score), s.max_frame_bytes)

    async def _send_error(self, stream: Any, reason: str, detail: str) -> None:
        with trio.move_on_after(self.settings.request_timeout_seconds):
            try:
                await wire.write_message(stream, wire.JudgeError(reason=reason, detail=detail[:1024]))
            except Exception:  # noqa: BLE001 - the peer may already be gone
                pass


async def _cancel_on_signal(scope: trio.CancelScope, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            log.info("received %s; stopping the judge", signal.Signals(signum).name)
            scope.cancel()
            return


async def run_judge(settings: JudgeSettings) -> dict[str, int]:
    """Serve evaluations until SIGINT/SIGTERM; returns the counters."""
    seed = bytes.fromhex(settings.identity_seed) if settings.identity_seed else None
    key_pair = load_or_create_identity(settings.data_dir, seed)
    store = ResultStore(settings.data_dir / DB_FILE_NAME)
    service = JudgeService(settings, key_pair, store)
    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(_cancel_on_signal, scope)
                await nursery.start(service.run)
                log.info("judge up: %d results in %s; tasks %s", store.count(), store.path, ", ".join(settings.tasks))
                for address in service.listen_addrs:
                    print(f"judge listening on {address}", flush=True)
    finally:
        store.close()
    log.info("judge stopped: %s", service.counters)
    return service.counters
