"""The node's side of the open judge (`--judge MULTIADDR --judge-every K`).

After every K-th round the round loop hands the round over (`round_done`, which never blocks);
the client's own task then opens one `/sapo/judge/1` stream, answers the judge's question
greedily (pass@1) with the node's policy under the torch lock, and logs the score. A dead,
slow or hostile judge costs a log line and a counter, never a round: every wait is bounded,
and evaluations that pile up while one is running are skipped, not queued. A judge of release
0.1.0 or 0.2.0 (judge wire v1) refuses this node's v2 request; that is logged with the judge's
own words and counted as `judge_retired_schema_version`.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import multiaddr
import trio

from sapo.node.core.metrics import RoundRecord
from sapo.protocol.toolkit.hosts import new_noise_host
from sapo.protocol.wire import judge_wire as wire
from sapo.training.completions.generation import greedy_completions
from sapo.training.models.policy import Policy
from sapo.training.problems.tasks import Problem, ProblemSpec

log = logging.getLogger("sapo.node.judge.server")

DIAL_TIMEOUT_SECONDS = 10.0
IO_TIMEOUT_SECONDS = 30.0
# The whole evaluation, including waiting for a round's torch work to release the lock.
EVALUATION_TIMEOUT_SECONDS = 300.0
CLOSE_TIMEOUT_SECONDS = 5.0
# What a long-lived node keeps of its judging: the page shows the latest scores (and all-time
# count and mean); the judge is told how many distinct peers the node has seen, up to a cap.
SCORES_KEPT = 1000
PEERS_SEEN_KEPT = 10_000


def answer_greedily(policy: Policy, problem: Problem, max_new_tokens: int) -> str:
    """One greedy completion (pass@1), cut at the closing </answer> like training rollouts."""
    return greedy_completions(policy, [policy.prompt(problem)], max_new_tokens)[0]


class JudgeClient:
    def __init__(
        self,
        address: str,
        every: int,
        key_pair: Any,
        policy: Policy,
        torch_lock: trio.Lock,
        max_new_tokens: int,
        *,
        evaluation_timeout: float = EVALUATION_TIMEOUT_SECONDS,
    ):
        from libp2p.peer.peerinfo import info_from_p2p_addr

        self.judge = info_from_p2p_addr(multiaddr.Multiaddr(address))
        self.every = every
        self.key_pair = key_pair
        self.policy = policy
        self.torch_lock = torch_lock
        self.max_new_tokens = max_new_tokens
        self.evaluation_timeout = evaluation_timeout
        self.counters: dict[str, int] = {}
        # (round, score): the latest SCORES_KEPT, and the count and sum of all, so that a node
        # judged for weeks holds no more than one judged for an hour
        self.scores: deque[tuple[int, float]] = deque(maxlen=SCORES_KEPT)
        self.judged = 0
        self.score_sum = 0.0
        self._peers_seen: set[str] = set()  # at most PEERS_SEEN_KEPT: the judge hears "at least that many"
        self._external_groups = 0
        # One slot: an evaluation due while another runs is skipped, never queued up.
        self._due_send, self._due_receive = trio.open_memory_channel[int](1)
        self._host: Any = None

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def round_done(self, record: RoundRecord) -> None:
        """Called by the round loop after each round; never blocks."""
        if len(self._peers_seen) < PEERS_SEEN_KEPT:
            self._peers_seen.update(record.peers)
            self._peers_seen.update(record.accepted_from)
        self._external_groups += record.external_groups
        if record.round % self.every:
            return
        try:
            self._due_send.send_nowait(record.round)
        except trio.WouldBlock:
            self._count("skipped_busy")

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Its own dial-only host (same key as the gossip host, so the judge sees our peer id),
        kept apart from gossip so the judge never counts as a swarm peer or meets the allowlist."""
        listen = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
        host = new_noise_host(self.key_pair, [listen])
        network = host.get_network()
        if hasattr(network, "retry_config"):
            network.retry_config.max_retries = 0  # one bounded try per evaluation; the next is K rounds away
        async with host.run([listen]):
            self._host = host
            try:
                task_status.started()
                async for node_round in self._due_receive:
                    await self.evaluate(node_round)
            finally:
                self._host = None
                with trio.move_on_after(CLOSE_TIMEOUT_SECONDS) as scope:
                    scope.shield = True
                    await host.close()

    async def evaluate(self, node_round: int) -> float | None:
        """One judged question; the score, or None (logged and counted) on any failure."""
        try:
            with trio.fail_after(self.evaluation_timeout):
                score = await self._evaluate(node_round)
        except wire.JudgeWireError as error:
            self._count(f"judge_{error.reason.value}")
            log.warning("judge evaluation at round %d failed: %s", node_round, error)
            return None
        except trio.TooSlowError:
            self._count("judge_timeout")
            log.warning("judge evaluation at round %d timed out; training goes on", node_round)
            return None
        except Exception as error:  # noqa: BLE001 - a dead judge never stops training
            self._count("judge_unreachable")
            log.warning(
                "judge %s unreachable at round %d (%s: %s); training goes on",
                self.judge.peer_id,
                node_round,
                type(error).__name__,
                str(error)[:200],
            )
            return None
        self._count("judged")
        self.scores.append((node_round, score))
        self.judged += 1
        self.score_sum += score
        log.info("judge: round %d scored %.2f (%d judged so far)", node_round, score, self.judged)
        return score

    async def _evaluate(self, node_round: int) -> float:
        host = self._host
        with trio.fail_after(DIAL_TIMEOUT_SECONDS):
            await host.connect(self.judge)
            stream = await host.new_stream(self.judge.peer_id, [wire.PROTOCOL_ID])
        try:
            request = wire.EvalRequest(
                peer_id=host.get_id().to_base58(),
                model_id=self.policy.model_id[:256],
                node_round=node_round,
                swarm_peers_seen=len(self._peers_seen),
                external_groups=self._external_groups,
            )
            with trio.fail_after(IO_TIMEOUT_SECONDS):
                await wire.write_message(stream, request)
                question = await wire.read_message(stream, wire.Question)
            # The judge sends the question and nothing that rebuilds its answer (issue #29). The
            # prompt reads only the text; the spec here is a placeholder, not the judge's.
            placeholder = ProblemSpec(dataset=question.task, seed=0, index=0)
            problem = Problem(spec=placeholder, question=question.question, answer="")
            async with self.torch_lock:
                text = await trio.to_thread.run_sync(answer_greedily, self.policy, problem, self.max_new_tokens)
            answer = wire.Answer(id=question.id, text=text[:16_384])
            with trio.fail_after(IO_TIMEOUT_SECONDS):
                await wire.write_message(stream, answer)
                score = await wire.read_message(stream, wire.Score)
            return score.score
        finally:
            with trio.move_on_after(CLOSE_TIMEOUT_SECONDS) as scope:
                scope.shield = True
                try:
                    await stream.close()
                except Exception:  # noqa: BLE001
                    pass
