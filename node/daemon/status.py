"""What a person watching a node wants at a glance, as one pydantic model: `NodeStatus`.

One schema for three readers: the node's live page (`GET /api/status`, drawn by
page/page.js), `sapo-node status` in a terminal, and the tests. A running node builds it from
its live state (live.py) and also writes it, without the curves, to DATA_DIR/status.json every
few seconds; `sapo-node status DATA_DIR` rebuilds the same model from that file and the
round records in metrics.jsonl, so it works on a stopped node too.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from sapo.node.core.metrics import METRICS_FILE, RoundRecord
from sapo.node.daemon.curves import MAX_POINTS, CurvePoint, RoundHistory, curve_point  # noqa: F401 - the page's schema

STATUS_FILE = "status.json"
FETCH_TIMEOUT_SECONDS = 10.0


class PeerRow(BaseModel):
    peer_id: str
    addresses: list[str] = Field(default_factory=list, description="addresses of the open connections to it")
    connected: bool
    accepted: int = Field(description="its groups that passed every check (accepted_from)")
    banned: bool = False
    agent: str | None = Field(default=None, description="what its libp2p identify says it runs, e.g. sapo/0.3.0")
    score: float | None = Field(
        default=None, description="its peer score here (0: nothing held against it; banned at -100)"
    )


class Progress(BaseModel):
    """Long start-up work in progress (the warm start)."""

    what: str
    done: int
    total: int
    elapsed_seconds: float
    seconds_left: float | None


class JudgeStatus(BaseModel):
    address: str
    every: int = Field(description="judged every this many rounds")
    last_round: int | None = None
    last_score: float | None = Field(default=None, description="pass@1 of the latest judged answer")
    judged: int = 0
    mean_score: float | None = None
    scores: list[tuple[int, float]] = Field(default_factory=list, description="(round, pass@1), the latest MAX_POINTS")
    failures: dict[str, int] = Field(default_factory=dict)


Phase = Literal[
    "starting", "loading model", "warm start", "waiting for peers", "training", "stopping", "stopped", "finished"
]
LOADING_PHASES = ("starting", "loading model", "warm start")


class NodeStatus(BaseModel):
    schema_version: Literal[1] = 1
    source: Literal["live", "files"] = Field(description="a running node's own answer, or rebuilt from its data dir")
    updated: float = Field(description="when this was true (unix time)")
    pid: int | None = None
    version: str | None = Field(default=None, description="this node's sapo release (its identify says sapo/<version>)")
    peer_id: str | None = None
    model: str | None = None
    data_dir: str | None = None
    phase: Phase | Literal["unknown"] = "unknown"
    progress: Progress | None = None
    started: float | None = Field(default=None, description="when the node process started (unix time)")
    listen: list[str] = Field(default_factory=list, description="addresses peers dial")
    page: list[str] = Field(default_factory=list, description="where this page is served")
    round: int = 0
    rounds_planned: int = Field(default=0, description="--rounds (0 = until stopped)")
    cumulative_reward: float = 0.0
    rounds: list[CurvePoint] = Field(default_factory=list, description="the curves, at most MAX_POINTS points")
    per_task: dict[str, float] = Field(default_factory=dict, description="last round's local reward per task")
    heldout: dict[str, float] | None = Field(default=None, description="latest held-out accuracy per task")
    heldout_round: int | None = None
    inbox_size: int = 0
    received: int = 0
    accepted: int = 0
    rejected: dict[str, int] = Field(default_factory=dict, description="refused groups by reason")
    logprobs: dict[str, int] = Field(
        default_factory=dict,
        description="peers' shared log-probs: received (messages), joined to their group, late, unmatched",
    )
    waiting_while_loading: int = Field(default=0, description="received groups held until the model is loaded")
    dropped: int = Field(default=0, description="received groups dropped because the node could not keep up")
    bans: list[str] = Field(default_factory=list, description="peers banned right now")
    peers_banned: int = Field(default=0, description="bans so far")
    peers: list[PeerRow] = Field(default_factory=list)
    transport: dict[str, int] = Field(
        default_factory=dict,
        description="the gossip layer's counters (protocol/README.md): e.g. peers_without_discovery (peers that lack "
        "an optional protocol), relay_circuits_limited (circuits this relay cut at its limits), relayed_links_recovered",
    )
    judge: JudgeStatus | None = None


# --- building it ---------------------------------------------------------------------------


def from_records(records: Iterable[RoundRecord], base: NodeStatus) -> NodeStatus:
    """`base` with everything the round records say filled in; live fields in `base`
    (counters, peers) win over the last record's copies of them."""
    history = RoundHistory(records)
    last = history.last
    if last is None:
        return base
    update: dict = {"round": last.round, "cumulative_reward": last.cumulative_reward, **history.fields()}
    if base.source == "files" and not base.peers and not base.received:
        update.update(counters_of(last))
    return base.model_copy(update=update)


def counters_of(record: RoundRecord) -> dict:
    """What a round record says about the traffic, for a status without a live node."""
    peers = set(record.peers)
    return {
        "inbox_size": record.inbox_size,
        "received": record.received,
        "accepted": record.accepted,
        "rejected": record.rejected,
        "dropped": record.transport.get("inbox_channel_full", 0),
        "peers_banned": record.transport.get("peers_banned", 0),
        "peers": peer_rows(sorted(peers), {}, record.accepted_from, []),
        "transport": record.transport,
    }


def peer_rows(
    connected: Iterable[str],
    addresses: dict[str, list[str]],
    accepted_from: dict[str, int],
    banned: list[str],
    agents: dict[str, str] | None = None,
    scores: dict[str, float] | None = None,
) -> list[PeerRow]:
    """Connected peers first, then peers we only hold groups from (relayed, or gone)."""
    connected = list(connected)
    agents, scores = agents or {}, scores or {}

    def row(p: str, is_connected: bool) -> PeerRow:
        return PeerRow(
            peer_id=p,
            addresses=addresses.get(p, []),
            connected=is_connected,
            accepted=accepted_from.get(p, 0),
            banned=p in banned,
            agent=agents.get(p),
            score=scores.get(p),
        )

    others = sorted(set(accepted_from) - set(connected), key=lambda p: -accepted_from[p])
    return [row(p, True) for p in connected] + [row(p, False) for p in others]


def read_records(data_dir: Path) -> Iterator[RoundRecord]:
    """The node's round records, oldest first, read one line at a time: a node that has run for
    months has hundreds of thousands, and whoever reads them keeps only what it bins."""
    path = data_dir / METRICS_FILE
    if not path.exists():
        return
    with path.open() as lines:
        for line in lines:
            try:
                yield RoundRecord.model_validate_json(line)
            except ValidationError:
                continue  # a torn last line from a crash mid-write


def write_status_file(data_dir: Path, status: NodeStatus) -> None:
    """DATA_DIR/status.json, without the curves (metrics.jsonl has them), replaced atomically."""
    path = data_dir / STATUS_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(status.model_copy(update={"rounds": []}).model_dump_json(indent=1))
    os.replace(tmp, path)


def status_from_data_dir(data_dir: Path) -> NodeStatus:
    """The node's status from its files: the last snapshot it wrote, and all its rounds."""
    if not data_dir.is_dir():
        raise ValueError(
            f"{data_dir} is not a node's data directory (no such directory); pass the --data-dir the node ran with"
        )
    path = data_dir / STATUS_FILE
    base = NodeStatus(source="files", updated=time.time(), data_dir=str(data_dir))
    if path.exists():
        try:
            base = NodeStatus.model_validate_json(path.read_text()).model_copy(update={"source": "files"})
        except ValidationError:
            pass  # from another release of sapo: the round records still tell most of it
    elif not (data_dir / METRICS_FILE).exists():
        raise ValueError(
            f"{data_dir} holds neither {STATUS_FILE} nor metrics.jsonl: has a node run with --data-dir {data_dir}?"
        )
    if base.phase not in ("stopped", "finished") and base.pid is not None and not _alive(base.pid):
        base = base.model_copy(update={"phase": "stopped"})  # killed without a last word
    return from_records(read_records(data_dir), base)


def status_from_url(url: str, timeout: float = FETCH_TIMEOUT_SECONDS) -> NodeStatus:
    """A running node's live status, from its page's JSON endpoint."""
    base = url.rstrip("/")
    if not base.endswith("/api/status"):
        base += "/api/status"
    try:
        with urllib.request.urlopen(base, timeout=timeout) as response:
            return NodeStatus.model_validate_json(response.read())
    except OSError as error:
        raise ValueError(
            f"no node answered at {base} ({error}); is it running with --metrics-port, and is that its port?"
        ) from None
    except ValidationError as error:
        raise ValueError(f"{base} did not answer with a sapo node status: {error.errors()[0]['msg']}") from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the terminal view ---------------------------------------------------------------------

SPARKS = "▁▂▃▄▅▆▇█"
# Counters worth a line of their own: peers without an optional protocol, relay circuits cut and recovered.
NETWORK_NOTES = ("peers_without_", "relay_circuits_limited", "relayed_links_")


def sparkline(values: list[float], width: int = 40) -> str:
    """The last `width` values as block characters, from 0 (lowest block) to the largest of them."""
    values = values[-width:]
    if not values:
        return ""
    top = max(values) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int(max(0.0, v) / top * (len(SPARKS) - 1) + 0.5))] for v in values)


def _ago(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def _short(peer_id: str) -> str:
    return peer_id if len(peer_id) <= 20 else f"{peer_id[:12]}…{peer_id[-6:]}"


def render_text(status: NodeStatus, now: float | None = None) -> str:
    """The summary `sapo-node status` prints: the page's content, as text."""
    now = time.time() if now is None else now
    lines = _state_lines(status, now)
    lines += _learning_lines(status)
    lines += _peer_lines(status)
    lines += _intake_lines(status)
    lines += _judge_lines(status)
    return "\n".join(lines)


def _state_lines(status: NodeStatus, now: float) -> list[str]:
    """Who the node is, what it is doing, and where to reach it while it runs."""
    who = f"node {status.peer_id or '?'}" + (f" ({status.model})" if status.model else "")
    planned = f" of {status.rounds_planned}" if status.rounds_planned else ""
    state = f"{status.phase}, round {status.round}{planned}"
    if status.source == "files":
        state += f"; status from files, written {_ago(now - status.updated)} ago"
    elif status.started:
        state += f", up {_ago(now - status.started)}"
    state += f", sapo {status.version}" if status.version else ""
    lines = [f"{who}: {state}"]
    if status.progress is not None:
        p = status.progress
        left = f", about {_ago(p.seconds_left)} left" if p.seconds_left is not None else ""
        lines.append(f"  {p.what}: {p.done}/{p.total}{left}")
    if status.phase not in ("stopped", "finished"):  # a stopped node's addresses dial nothing
        for address in status.listen:
            lines.append(f"  dial      {address}")
        for url in status.page[:1]:
            lines.append(f"  page      {url}")
    return lines


def _learning_lines(status: NodeStatus) -> list[str]:
    """Is it learning: the last round's reward and its trend, external groups, held-out, time."""
    points = status.rounds
    if not points:
        return ["reward     no round finished yet"]
    last = points[-1]
    lines = [
        f"reward     {last.reward:.3f}  accuracy {last.accuracy:.3f}  format {last.format_rate:.2f}  "
        f"cumulative {status.cumulative_reward:.2f}"
    ]
    recent = [p.reward for p in points][-40:]
    lines.append(f"           {sparkline(recent)}  (reward, last {len(recent)} points, 0 to {max(recent):.2f})")
    external = [p for p in points if p.external_reward is not None]
    if external:
        e = external[-1]
        lines.append(
            f"external   {e.external_reward:.3f} on {e.external_groups:g} group(s) at round {e.round} (this node's verifier)"
        )
    else:
        lines.append("external   no external groups trained on yet")
    if status.heldout:
        tasks = ", ".join(f"{task} {value:.2f}" for task, value in sorted(status.heldout.items()))
        lines.append(
            f"held-out   {sum(status.heldout.values()) / len(status.heldout):.3f} at round {status.heldout_round} ({tasks})"
        )
    lines.append(
        f"round time {last.round_seconds:.1f} s: generation {last.generate_seconds:.1f} s, update {last.train_seconds:.1f} s"
    )
    return lines


def _peer_lines(status: NodeStatus) -> list[str]:
    """Each peer: its agent, how many of its groups were accepted, where it is, a ban or a score."""
    lines = [f"peers      {sum(p.connected for p in status.peers)} connected"]
    for peer in status.peers:
        where = ", ".join(peer.addresses) or ("connected" if peer.connected else "not connected")
        flags = " BANNED" if peer.banned else ""
        score = f"  score {peer.score:g}" if peer.score else ""
        lines.append(
            f"  {_short(peer.peer_id):<21} {peer.agent or '?':<18} {peer.accepted:>6} accepted  {where}{flags}{score}"
        )
    return lines


def _intake_lines(status: NodeStatus) -> list[str]:
    """What arrived: the inbox, refusals by reason, what waited or was dropped, bans, network notes."""
    rejected = ", ".join(
        f"{reason} {count}" for reason, count in sorted(status.rejected.items(), key=lambda kv: -kv[1])
    )
    lines = [
        f"inbox      {status.inbox_size} group(s); received {status.received}, accepted {status.accepted}, "
        f"rejected {sum(status.rejected.values())}" + (f" ({rejected})" if rejected else "")
    ]
    if status.waiting_while_loading or status.dropped:
        lines.append(
            f"           {status.waiting_while_loading} waiting for the model to load, {status.dropped} dropped (node too busy)"
        )
    lines.append(
        f"bans       {len(status.bans)} now, {status.peers_banned} so far"
        + (f": {', '.join(map(_short, status.bans))}" if status.bans else "")
    )
    manners = {k: v for k, v in status.transport.items() if k.startswith(NETWORK_NOTES)}
    if manners:
        lines.append("network    " + ", ".join(f"{k} {v}" for k, v in sorted(manners.items())))
    return lines


def _judge_lines(status: NodeStatus) -> list[str]:
    """The judge's latest score, or why there is none yet; nothing without a judge."""
    if status.judge is None:
        return []
    j = status.judge
    if j.last_score is not None:
        return [
            f"judge      pass@1 {j.last_score:.2f} at round {j.last_round} ({j.judged} judged, mean {j.mean_score:.2f})"
        ]
    failures = ", ".join(f"{k} {v}" for k, v in j.failures.items())
    return [f"judge      not judged yet (every {j.every} rounds)" + (f"; {failures}" if failures else "")]
