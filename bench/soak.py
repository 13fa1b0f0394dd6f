"""Soak a node with a flood of valid groups, and watch its peer guard deal with it.

(The fuzz run over hostile frames is a test: tests/hardening/fuzz.py, 2,000 frames in the
suite and 100,000 with `make test-all`.)

flood: a real `sapo-node start` process; one attacker network (open_network) publishes valid, distinct
       groups at --flood-rate per second (its own GossipSub spam limit switched off, as a
       hostile client would) while an honest peer publishes 4 per second, for --flood-seconds,
       after a warm-up in which the node trains on the honest peer's groups alone (so that what
       the allocator takes for a shared round is not counted as the flood's). Prints the node's
       RSS before/after, its inbox size against the cap, the honest peer's
       delivery, and what became of the flooder: how many of its groups got in, when the
       node's peer guard banned it (protocol/peers/peer_guard.py) and dropped its connection, and
       how often its redials were refused.

    .venv/bin/python -m bench.soak                    # 400/s flood for 20 s
    .venv/bin/python -m bench.soak --smoke            # an 8 s flood
"""

from __future__ import annotations

import argparse
import collections
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LISTEN = re.compile(r"listening on (/ip4/127\.0\.0\.1/tcp/\d+/p2p/(\w+))")
INBOX_CAP = 512  # the node's --inbox-max-groups: the flood must not fill it past this
WARM_ROUNDS = 5  # rounds the node trains on external groups before the flood starts
TINY = [
    "--model",
    "tiny",
    "--tasks",
    "basic_arithmetic",
    "--max-new-tokens",
    "24",
    "--generations",
    "4",
    "--warm-start-steps",
    "0",
    "--torch-threads",
    "1",
    "--listen",
    "/ip4/127.0.0.1/tcp/0",
]


# --- flood ------------------------------------------------------------------------------------


@dataclass
class FloodReport:
    seconds: float
    attempted: int
    flooder_published: int
    honest_published: int
    rss_before_mb: float
    rss_after_mb: float
    inbox_size: int
    inbox_cap: int
    inbox_peak: int
    honest_accepted: int
    flooder_accepted: int
    node_received: int
    transport: dict
    rejected: dict
    rate_limited_warnings: int
    flooder_still_connected: bool
    node_alive: bool
    rounds_during: int
    banned_after: float | None  # seconds from the first flood message to the node's "banned peer" log line
    flooder_disconnected_after: float | None  # ... to its "dropped the connection to banned peer" line
    redials_refused: int  # the flooder's reconnections the node refused while it was banned
    peers_banned: int
    node_rate_limited: int
    node_refused_banned: int

    def lines(self) -> list[str]:
        return [
            f"flood: {self.seconds:.0f}s, attacker attempted {self.attempted} ({self.attempted / self.seconds:.0f}/s), "
            f"its publish() succeeded {self.flooder_published}; honest peer published {self.honest_published}",
            f"  node alive: {self.node_alive}; rounds during the flood: {self.rounds_during}",
            f"  node RSS: {self.rss_before_mb:.0f} MB before -> {self.rss_after_mb:.0f} MB after",
            f"  inbox: {self.inbox_size} now, peak {self.inbox_peak}, cap {self.inbox_cap}",
            f"  honest peer's groups accepted during the flood: {self.honest_accepted}; flooder's accepted: {self.flooder_accepted}",
            f"  node received (gossip layer): {self.node_received}; transport counters: {self.transport}",
            f"  rejected: {self.rejected}",
            f"  flooder's fate: peers_banned={self.peers_banned}, banned {_seconds(self.banned_after)} and "
            f"disconnected {_seconds(self.flooder_disconnected_after)} after its first message"
            + f" (still connected at the end: {self.flooder_still_connected}); the node dropped {self.node_rate_limited} "
            f"of its messages over the rate limit, then {self.node_refused_banned} messages and connections while it was "
            f"banned, {self.redials_refused} of them redials; "
            f"{self.rate_limited_warnings} 'Rate limit exceeded' drops logged by GossipSub",
        ]


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}s"


def _logged_at(log_text: str, needle: str) -> float | None:
    """Wall time of the node's first log line holding `needle` (asctime, local time, ms)."""
    import datetime

    for line in log_text.splitlines():
        if needle in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    return None


def _read_metrics(data_dir: Path) -> list[dict]:
    import json

    path = data_dir / "metrics.jsonl"
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def start_victim(data: Path, log) -> subprocess.Popen:
    """The node under attack: a real `sapo-node start` process, its log in `log`."""
    # A fixed 2/2 round: the adaptive default's probes (1/3, 3/1) change the batch's shape from
    # round to round, and the allocator's growth for each new shape (+130-200 MB against +60-100
    # fixed, measured) would read as memory the flood took.
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sapo.node.cli",
            "start",
            *TINY,
            "--local",
            "2",
            "--external",
            "2",
            "--balance",
            "fixed",
            "--sampler",
            "uniform",
            "--rounds",
            "0",
            # the topic path, which a flood takes: in fetch mode (the default) a stranger's group
            # on the topic is refused before any check, and the honest peer's would be too
            "--exchange",
            "gossip",
            "--inbox-max-groups",
            str(INBOX_CAP),
            "--data-dir",
            str(data),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )


async def listen_address(proc: subprocess.Popen, log_path: Path) -> str:
    import trio

    line = ""
    while not LISTEN.search(line):
        line = await trio.to_thread.run_sync(proc.stdout.readline)
        if not line and proc.poll() is not None:
            raise RuntimeError(f"node exited early; see {log_path}")
    return LISTEN.search(line).group(1)


def group_maker():
    """group(i): a distinct, verifiable two-completion group for each i (64 problems, cycled)."""
    from sapo.training.problems.rollouts import QuestionGroup
    from sapo.training.problems.tasks import TaskSampler, default_task_specs

    sampler = TaskSampler(default_task_specs(["basic_arithmetic"]), 99, 0)
    problems = sampler.sample(64)  # distinct problems, so frames are distinct and verifiable

    def group(i: int) -> QuestionGroup:
        p = problems[i % len(problems)]
        return QuestionGroup(
            problem=p, completions=[f"<answer>{p.answer}</answer>", f"<answer>{i}</answer>"], rewards=[1.0, 0.0]
        )

    return group


def attacker_and_honest(address: str) -> dict:
    """name -> (network task, encoder, peer id, incoming) for the flooder and the honest peer, both
    dialling the node; `await nursery.start(task)` opens the network and gives it back."""
    from functools import partial

    import trio
    from libp2p.crypto.ed25519 import create_new_key_pair

    from sapo.node.core.exchange import GroupEncoder
    from sapo.protocol.network import serve_network
    from sapo.protocol.peers.identity import peer_id_of
    from sapo.protocol.settings import NetworkSettings
    from sapo.training.problems.tasks import reasoning_gym_version

    peers = {}
    for name, seed in (("flooder", 0x31), ("honest", 0x32)):
        key = create_new_key_pair(bytes([seed]) * 32)
        send, _receive = trio.open_memory_channel(10_000)
        settings = NetworkSettings(listen="/ip4/127.0.0.1/tcp/0", peers=[address], exchange="gossip")
        service = partial(serve_network, settings, key, send)
        encoder = GroupEncoder(
            peer_id=peer_id_of(key), swarm="default", model_id=name, rg_version=reasoning_gym_version()
        )
        peers[name] = (service, encoder, peer_id_of(key), _receive)
    return peers


@dataclass
class Load:
    """What the flood and the honest peer published, and the largest inbox the node's metrics showed."""

    counts: collections.Counter = field(default_factory=collections.Counter)
    inbox_peak: int = 0


async def publish_flood(flooder, encoder, group, seconds: float, rate: float, load: Load) -> None:
    import trio

    i = 0
    start = trio.current_time()
    while trio.current_time() - start < seconds:
        i += 1
        load.counts["attempted"] += 1
        if await flooder.publish(encoder.frame(group(i), i)):
            load.counts["flooder_published"] += 1
        delay = start + i / rate - trio.current_time()
        await trio.sleep(max(delay, 0))


async def publish_honestly(honest, encoder, group, seconds: float, load: Load) -> None:
    import trio

    start = trio.current_time()
    i = 1000
    while trio.current_time() - start < seconds:
        i += 1
        if await honest.publish(encoder.frame(group(i), i)):
            load.counts["honest_published"] += 1
        await trio.sleep(0.25)


async def watch_inbox(data: Path, load: Load) -> None:
    import trio

    while True:
        rows = _read_metrics(data)
        if rows:
            load.inbox_peak = max(load.inbox_peak, rows[-1]["inbox_size"])
        await trio.sleep(1)


async def warm_up(honest, encoder, group, data: Path) -> None:
    """The node trains on the honest peer's groups first: its first rounds with external groups
    grow the allocator for a batch twice the size of a lone node's (measured +40 to +105 MB in
    12 s from a cold start), which would read as memory the flood took."""
    import trio

    with trio.fail_after(90):
        i = 0
        while sum(r.get("external_groups", 0) > 0 for r in _read_metrics(data)) < WARM_ROUNDS:
            i += 1
            await honest.publish(encoder.frame(group(500 + i), 500 + i))
            await trio.sleep(0.25)


async def flood_node(address: str, data: Path, node_ps, seconds: float, rate: float) -> dict:
    """Connect both peers, warm the node up, then flood it beside the honest peer: what was measured."""
    import trio

    group = group_maker()
    load = Load()
    async with trio.open_nursery() as nursery:
        peers = {
            name: (await nursery.start(task), *rest) for name, (task, *rest) in attacker_and_honest(address).items()
        }
        with trio.fail_after(30):
            while not all(s.connected_peers() for s, *_ in peers.values()):
                await trio.sleep(0.2)
        await trio.sleep(3)  # mesh up
        flooder, f_enc, flooder_id, _ = peers["flooder"]
        honest, h_enc, honest_id, _ = peers["honest"]
        await warm_up(honest, h_enc, group, data)
        rows = _read_metrics(data)
        measured = {
            "flooder_id": flooder_id,
            "honest_id": honest_id,
            "load": load,
            "rss_before_mb": node_ps.memory_info().rss / 2**20,
            "rounds_before": max((r["round"] for r in rows), default=0),
            "honest_before": rows[-1]["accepted_from"].get(honest_id, 0),
        }
        flooder.pubsub.router.spam_protection_enabled = False  # a hostile client ignores its own limit
        nursery.start_soon(watch_inbox, data, load)
        t0, measured["wall0"] = trio.current_time(), time.time()
        async with trio.open_nursery() as publishers:
            publishers.start_soon(publish_flood, flooder, f_enc, group, seconds, rate, load)
            publishers.start_soon(publish_honestly, honest, h_enc, group, seconds, load)
        measured["seconds"] = trio.current_time() - t0
        await trio.sleep(3)  # let the intake drain
        # Open connections only. The node's own log times the ban and the disconnect: this
        # process, flooding flat out, notices a closed connection seconds late (on a loaded
        # machine more than the 3 s above: the test suite saw it still open once), so it is given
        # up to 10 s more to see it closed; a flooder the node let back in stays connected.
        with trio.move_on_after(10):
            while flooder.connected_peers():
                await trio.sleep(0.2)
        measured["still_connected"] = bool(flooder.connected_peers())
        nursery.cancel_scope.cancel()
    return measured


def flood_report(measured: dict, data: Path, log_text: str, node_ps, node_alive: bool) -> FloodReport:
    """The node's own view after the flood (its metrics and log) beside what the peers measured."""
    last = _read_metrics(data)[-1]
    flooder_id, load, wall0 = measured["flooder_id"], measured["load"], measured["wall0"]
    transport = last["transport"]
    banned_at = _logged_at(log_text, f"banned peer {flooder_id}")
    disconnected_at = _logged_at(log_text, f"dropped the connection to banned peer {flooder_id}")
    return FloodReport(
        seconds=measured["seconds"],
        attempted=load.counts["attempted"],
        flooder_published=load.counts["flooder_published"],
        honest_published=load.counts["honest_published"],
        rss_before_mb=measured["rss_before_mb"],
        rss_after_mb=node_ps.memory_info().rss / 2**20,
        inbox_size=last["inbox_size"],
        inbox_cap=INBOX_CAP,
        inbox_peak=max(load.inbox_peak, last["inbox_size"]),
        honest_accepted=last["accepted_from"].get(measured["honest_id"], 0) - measured["honest_before"],
        flooder_accepted=last["accepted_from"].get(flooder_id, 0),
        node_received=last["received"],
        transport=last["transport"],
        rejected=last["rejected"],
        rate_limited_warnings=log_text.count("Rate limit exceeded"),
        flooder_still_connected=measured["still_connected"],
        node_alive=node_alive,
        rounds_during=last["round"] - measured["rounds_before"],
        banned_after=None if banned_at is None else banned_at - wall0,
        flooder_disconnected_after=None if disconnected_at is None else disconnected_at - wall0,
        peers_banned=transport.get("peers_banned", 0),
        node_rate_limited=transport.get("rate_limited", 0),
        node_refused_banned=transport.get("banned", 0),
        redials_refused=log_text.count(f"refusing peer {flooder_id}: banned"),
    )


async def _flood(seconds: float, rate: float, workdir: Path) -> FloodReport:
    import logging

    import psutil
    import trio

    # the honest peer's own GossipSub rate-limits the flood the node relays to it: not our output
    logging.getLogger("libp2p").setLevel(logging.ERROR)
    data = workdir / "victim"
    log_path = workdir / "victim.log"
    log = log_path.open("w")
    proc = start_victim(data, log)
    try:
        with trio.fail_after(seconds + 120):
            address = await listen_address(proc, log_path)
            node_ps = psutil.Process(proc.pid)
            measured = await flood_node(address, data, node_ps, seconds, rate)
        log.flush()
        return flood_report(measured, data, log_path.read_text(), node_ps, proc.poll() is None)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def flood(seconds: float, rate: float, workdir: Path | None = None) -> FloodReport:
    import trio

    if workdir is not None:
        return trio.run(_flood, seconds, rate, workdir)
    with tempfile.TemporaryDirectory(prefix="sapo-soak-") as tmp:
        return trio.run(_flood, seconds, rate, Path(tmp))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood-rate", type=float, default=400.0, help="attacker publishes per second (default: 400)")
    parser.add_argument("--flood-seconds", type=float, default=20.0)
    parser.add_argument("--smoke", action="store_true", help="an 8 s flood (long enough to see the ban)")
    args = parser.parse_args()
    if args.smoke:
        args.flood_seconds = 8.0
    report = flood(args.flood_seconds, args.flood_rate)
    print("\n".join(report.lines()), flush=True)
    failed = not report.node_alive or report.honest_accepted == 0 or report.inbox_peak > report.inbox_cap
    failed |= not report.peers_banned
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
