"""Prometheus `/metrics` for one node, served by a small trio HTTP handler.

prometheus_client's own server runs in a bare background thread; this one lives in the
daemon's nursery like everything else. Each node has its own registry: no global state.
"""

from __future__ import annotations

import logging
from collections import deque

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sapo.node.daemon.metrics import RoundRecord

log = logging.getLogger("sapo.prometheus")

REQUEST_TIMEOUT_SECONDS = 5.0
MAX_REQUEST_BYTES = 8192


class NodeMetrics:
    def __init__(self, ma_window: int = 100):
        self.registry = CollectorRegistry()
        r = self.registry
        self.round = Gauge("sapo_round", "last finished round", registry=r)
        self.reward = Gauge("sapo_local_reward", "mean reward of this round's local completions", registry=r)
        self.reward_ma = Gauge("sapo_local_reward_ma", f"moving average of sapo_local_reward over {ma_window} rounds", registry=r)
        self.cumulative = Gauge("sapo_cumulative_reward", "sum of sapo_local_reward over rounds (the paper's metric)", registry=r)
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
        self.tokens_per_second = Gauge("sapo_generation_tokens_per_second", "generated tokens per second, last round", registry=r)
        self.step_seconds = Gauge("sapo_step_seconds", "seconds of the last round, by phase", ["phase"], registry=r)
        self._window: deque[float] = deque(maxlen=ma_window)
        self._seen: dict[str, float] = {}

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

    def _advance(self, counter, key: str, total: float) -> None:
        """The node keeps running totals; Prometheus counters only go up by increments."""
        delta = total - self._seen.get(key, 0)
        if delta > 0:
            counter.inc(delta)
        self._seen[key] = total

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def serve_metrics(metrics: NodeMetrics, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    log.info("metrics on http://%s:%d/metrics", host, bound)
    task_status.started(bound)

    async def handle(stream: trio.SocketStream) -> None:
        with trio.move_on_after(REQUEST_TIMEOUT_SECONDS):
            request = b""
            while b"\r\n\r\n" not in request and len(request) < MAX_REQUEST_BYTES:
                chunk = await stream.receive_some(1024)
                if not chunk:
                    return
                request += chunk
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
            if path.split(b"?")[0] == b"/metrics":
                body, status, kind = metrics.render(), b"200 OK", CONTENT_TYPE_LATEST.encode()
            else:
                body, status, kind = b"not found; try /metrics\n", b"404 Not Found", b"text/plain"
            head = b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind + b"\r\nContent-Length: " + str(len(body)).encode()
            await stream.send_all(head + b"\r\nConnection: close\r\n\r\n" + body)
        await stream.aclose()

    await trio.serve_listeners(handle, listeners)
