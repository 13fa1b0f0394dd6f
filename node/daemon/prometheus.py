"""Prometheus `/metrics` for one node (served by web.py, beside the page).

Each node has its own registry: no global state. Round gauges move once per round (from the
round record); the live ones (peers, bans, inbox, judge) are refreshed at every scrape from
the same status the page shows.
"""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sapo.node.core.metrics import RoundRecord
from sapo.node.daemon.status import LOADING_PHASES, NodeStatus

CONTENT_TYPE = CONTENT_TYPE_LATEST


class NodeMetrics:
    def __init__(self, ma_window: int = 100):
        self.registry = CollectorRegistry()
        r = self.registry
        self.round = Gauge("sapo_round", "last finished round", registry=r)
        self.reward = Gauge("sapo_local_reward", "mean reward of this round's local completions", registry=r)
        self.reward_ma = Gauge(
            "sapo_local_reward_ma", f"moving average of sapo_local_reward over {ma_window} rounds", registry=r
        )
        self.cumulative = Gauge(
            "sapo_cumulative_reward", "sum of sapo_local_reward over rounds (the paper's metric)", registry=r
        )
        self.inbox = Gauge("sapo_inbox_groups", "external question groups waiting in the inbox", registry=r)
        self.external = Gauge("sapo_external_groups", "external groups trained on in the last round", registry=r)
        self.received = Counter("sapo_received_groups", "group messages received from peers", registry=r)
        self.rejected = Counter("sapo_rejected_groups", "group messages refused, by reason", ["reason"], registry=r)
        self.published = Counter("sapo_published_groups", "local groups published", registry=r)
        self.peers = Gauge("sapo_connected_peers", "connected peers", registry=r)
        self.transport = Counter(
            "sapo_transport_events",
            "gossip-layer events by name: peers_banned, rate_limited, banned, peers_discovered, "
            "discovery_connected, dial_failed, ... (protocol/README.md)",
            ["event"],
            registry=r,
        )
        self.tokens_per_second = Gauge(
            "sapo_generation_tokens_per_second", "generated tokens per second, last round", registry=r
        )
        self.step_seconds = Gauge("sapo_step_seconds", "seconds of the last round, by phase", ["phase"], registry=r)
        self.accuracy = Gauge(
            "sapo_local_accuracy", "fraction of this round's local completions with full credit", registry=r
        )
        self.format_rate = Gauge(
            "sapo_format_rate", "fraction of this round's local completions with an <answer> tag", registry=r
        )
        self.external_reward = Gauge(
            "sapo_external_reward",
            "this node's verifier on the external completions trained on (last round that had some)",
            registry=r,
        )
        self.heldout = Gauge(
            "sapo_heldout_accuracy", "held-out greedy accuracy by task (--eval-every)", ["task"], registry=r
        )
        self.accepted = Counter("sapo_accepted_groups", "received groups that passed every check", registry=r)
        self.accepted_from = Counter(
            "sapo_accepted_groups_from", "accepted groups by the peer that wrote them", ["peer"], registry=r
        )
        self.banned = Gauge("sapo_banned_peers", "peers banned right now", registry=r)
        self.judge_score = Gauge(
            "sapo_judge_score", "the open judge's pass@1 on this node's latest judged answer", registry=r
        )
        self.judged = Gauge("sapo_judged", "answers the judge has scored (this process)", registry=r)
        self.loading = Gauge("sapo_loading", "1 while the node loads its model or warm-starts, else 0", registry=r)
        self.info = Gauge(
            "sapo_node_info",
            "always 1; its labels name the node behind a scrape address",
            ["peer_id", "model"],
            registry=r,
        )
        self._window: deque[float] = deque(maxlen=ma_window)
        self._seen: dict[str, float] = {}
        self._peers_exported: set[str] = set()  # the peers with an accepted_from series now

    def observe(self, record: RoundRecord) -> None:
        self._window.append(record.reward_mean)
        self.round.set(record.round)
        self.reward.set(record.reward_mean)
        self.reward_ma.set(sum(self._window) / len(self._window))
        self.cumulative.set(record.cumulative_reward)
        self.inbox.set(record.inbox_size)
        self.external.set(record.external_groups)
        self._advance(self.received, "received", record.received)
        self._advance(self.published, "published", record.published)
        for reason, count in record.rejected.items():
            self._advance(self.rejected.labels(reason=reason), f"rejected:{reason}", count)
        for event, count in record.transport.items():
            self._advance(self.transport.labels(event=event), f"transport:{event}", count)
        self.peers.set(len(record.peers))
        self.tokens_per_second.set(record.tokens_per_second)
        self.step_seconds.labels(phase="generate").set(record.generate_seconds)
        self.step_seconds.labels(phase="train").set(record.train_seconds)
        self.step_seconds.labels(phase="round").set(record.round_seconds)
        self.accuracy.set(record.accuracy)
        self.format_rate.set(record.format_rate)
        if record.external_reward_mean is not None:
            self.external_reward.set(record.external_reward_mean)
        for task, value in (record.heldout or {}).items():
            self.heldout.labels(task=task).set(value)
        self._advance(self.accepted, "accepted", record.accepted)
        for peer, count in record.accepted_from.items():
            self._advance(self.accepted_from.labels(peer=peer), f"accepted_from:{peer}", count)
        for peer in self._peers_exported - record.accepted_from.keys():  # forgotten by the node's counters
            self.accepted_from.remove(peer)
            del self._seen[f"accepted_from:{peer}"]
        self._peers_exported = set(record.accepted_from)

    def observe_status(self, status: NodeStatus) -> None:
        """What changes between rounds, as the page sees it now."""
        if status.peer_id:
            self.info.labels(peer_id=status.peer_id, model=status.model or "").set(1)
        self.peers.set(sum(p.connected for p in status.peers))
        self.inbox.set(status.inbox_size)
        self.banned.set(len(status.bans))
        self.loading.set(1 if status.phase in LOADING_PHASES else 0)
        for event, count in status.transport.items():  # between rounds too
            self._advance(self.transport.labels(event=event), f"transport:{event}", count)
        if status.judge is not None:
            self.judged.set(status.judge.judged)
            if status.judge.last_score is not None:
                self.judge_score.set(status.judge.last_score)

    def _advance(self, counter, key: str, total: float) -> None:
        """The node keeps running totals; Prometheus counters only go up by increments."""
        delta = total - self._seen.get(key, 0)
        if delta > 0:
            counter.inc(delta)
        self._seen[key] = total

    def render(self) -> bytes:
        return generate_latest(self.registry)
