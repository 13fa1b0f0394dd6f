"""`sapo-node status DATA_DIR` and the NodeStatus model behind it and the page, on data
directories written the way a node writes them (MetricsLog, status.json)."""

import json
import subprocess
import sys
import tracemalloc
from types import SimpleNamespace

from pytest import approx

from sapo.node.cli import main
from sapo.node.core.metrics import MetricsLog
from sapo.node.daemon.curves import Curve, RoundHistory
from sapo.node.daemon.status import (
    MAX_POINTS,
    NodeStatus,
    PeerRow,
    curve_point,
    render_text,
    sparkline,
    status_from_data_dir,
    write_status_file,
)
from tests.support.processes import sapo_node
from tests.support.records import PEER, record


def write_rounds(data_dir, records):
    log = MetricsLog(data_dir / "metrics.jsonl")
    for r in records:
        log.append(r)


def test_a_stopped_nodes_rounds_and_traffic_come_from_metrics_jsonl(tmp_path):
    write_rounds(tmp_path, [record(1), record(2, heldout={"basic_arithmetic": 0.5}), record(3)])
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"round": 4, "torn')  # a crash mid-write
    status = status_from_data_dir(tmp_path)
    assert status.source == "files" and status.round == 3
    assert [p.round for p in status.rounds] == [1, 2, 3]
    assert status.rounds[1].heldout == 0.5 and status.heldout_round == 2
    assert status.received == 30 and status.rejected == {"duplicate": 6} and status.peers_banned == 1
    assert status.peers == [PeerRow(peer_id=PEER, connected=True, accepted=24)]
    text = render_text(status)
    assert "round 3" in text and "reward     0.300" in text and "held-out   0.500 at round 2" in text
    assert "duplicate 6" in text and PEER[:12] in text and "24 accepted" in text


def test_the_last_status_file_wins_for_live_fields_and_a_dead_pid_reads_as_stopped(tmp_path):
    write_rounds(tmp_path, [record(1), record(2)])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    snapshot = NodeStatus(
        source="live",
        updated=2000.0,
        pid=int(dead.stdout),
        peer_id="12D3KooWme",
        model="tiny",
        phase="training",
        listen=["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWme"],
        bans=[PEER],
        peers_banned=1,
        peers=[PeerRow(peer_id=PEER, addresses=["/ip4/127.0.0.1/tcp/5555"], connected=True, accepted=3, banned=True)],
    )
    write_status_file(tmp_path, snapshot)
    assert json.loads((tmp_path / "status.json").read_text())["rounds"] == []  # the curves live in metrics.jsonl
    status = status_from_data_dir(tmp_path)
    assert status.phase == "stopped"  # its process is gone
    assert status.peers[0].addresses == ["/ip4/127.0.0.1/tcp/5555"] and status.bans == [PEER]
    assert [p.round for p in status.rounds] == [1, 2]
    text = render_text(status, now=2030.0)
    assert "stopped, round 2" in text and "written 30 s ago" in text
    assert "dial" not in text  # a stopped node's address dials nothing
    assert "BANNED" in text


def test_long_runs_are_binned_to_at_most_max_points_with_the_newest_round_last():
    records = [record(n) for n in range(1, 2501)]
    points = [curve_point(r) for r in records]
    out = RoundHistory(records).curve.points()
    # 2,500 rounds: bins of 4 rounds (1,000 of 2 were too many at round 2,001), the last one filling
    assert len(out) == 625 and [p.round for p in out[:2]] == [4, 8] and out[-1].round == 2500
    assert out[0].reward == approx(sum(p.reward for p in points[:4]) / 4)
    assert out[-1].reward == approx(sum(p.reward for p in points[-4:]) / 4)
    assert RoundHistory(records[:10]).curve.points() == points[:10]
    # a field measured on some rounds only is averaged over those
    sparse = Curve(limit=2)
    for n in range(1, 5):
        sparse.add(curve_point(record(n, heldout={"basic_arithmetic": 0.5} if n == 2 else None)))
    assert [(p.round, p.heldout) for p in sparse.points()] == [(2, 0.5), (4, None)]


def test_a_live_node_holds_the_same_memory_after_16000_rounds_as_after_8000(tmp_path):
    """The page's curves are bins, not every round a node ever ran (5.6 KB a round before)."""
    from sapo.node.core.counters import NodeCounters
    from sapo.node.core.state import NodeState, RandomStreams
    from sapo.node.daemon.live import LoadedNode
    from sapo.node.flags import node_settings_from_flags
    from sapo.sampling.balance import BalanceState
    from tests.support.live import live_status

    live = live_status(node_settings_from_flags(["--data-dir", str(tmp_path)]), "12D3KooWme")
    base, streams = record(1), RandomStreams.from_seed(0)
    start = NodeState(round=0, balance=BalanceState(external=4), streams=streams)
    # the parts of a node the page reads: no model needs to load for its curves
    node = SimpleNamespace(data_dir=tmp_path, counters=NodeCounters(), inbox=[])
    live.node_ready(LoadedNode(node, None, start))
    tracemalloc.start()
    try:
        held = []
        for n in range(1, 16001):
            done = base.model_copy(update={"round": n, "time": 1000.0 + n})
            live.after_round(NodeState(round=n, balance=BalanceState(external=4), streams=streams), done)
            if n in (8000, 16000):
                held.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert held[1] - held[0] < 100_000, f"{(held[1] - held[0]) / 8000:.0f} bytes more per round"
    rounds = live.snapshot().rounds
    assert len(rounds) == MAX_POINTS and rounds[-1].round == 16000


def test_reading_a_long_runs_files_holds_the_same_memory_at_8000_rounds_as_at_4000(tmp_path):
    """`sapo-node status` and a restarting node's page read metrics.jsonl a line at a time: all of
    a months-long run's records at once would be 5.6 KB a round."""
    base = record(1)
    peaks = []
    for start in (1, 4001):
        write_rounds(
            tmp_path, (base.model_copy(update={"round": n, "time": 1000.0 + n}) for n in range(start, start + 4000))
        )
        tracemalloc.start()
        try:
            status = status_from_data_dir(tmp_path)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert status.round == start + 3999
    assert peaks[1] - peaks[0] < 1_000_000, f"{(peaks[1] - peaks[0]) / 4000:.0f} bytes more per round"


def test_sparkline_runs_from_zero_to_the_largest_value():
    assert sparkline([0, 0.5, 1]) == "▁▅█"
    assert sparkline([0, 0.1, 0.2]) == "▁▅█"
    assert sparkline([0, 0]) == "▁▁"
    assert sparkline([]) == ""


def test_status_command_names_what_is_missing(tmp_path, capsys):
    # the CLI's own main(), in this process: these errors need no child process to show
    cases = [
        ([str(tmp_path / "nope")], "no such directory"),
        ([str(tmp_path)], "has a node run"),
        ([], "--url"),
        (["--url", "http://127.0.0.1:9"], "no node answered"),
    ]
    for args, message in cases:
        assert main(["status", *args]) == 1
        assert message in capsys.readouterr().err


def test_status_command_prints_the_summary_and_json(tmp_path):
    write_rounds(tmp_path, [record(1), record(2)])
    text = sapo_node("status", str(tmp_path))
    assert text.returncode == 0, text.stderr
    assert "round 2" in text.stdout and "external   0.250 on 2 group(s) at round 2" in text.stdout
    as_json = sapo_node("status", str(tmp_path), "--json")
    assert NodeStatus.model_validate_json(as_json.stdout).round == 2
