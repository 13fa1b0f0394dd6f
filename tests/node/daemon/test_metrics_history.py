"""metrics.jsonl stays bounded for a node that runs for months: a resume streams it (it never
holds the history in memory), and the file is compacted past its cap, durably, with the page
and `sapo-node status` still reading it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sapo.node.core.metrics import METRICS_FILE, MetricsLog, RoundRecord
from sapo.node.daemon.status import status_from_data_dir
from tests.support.processes import sapo_node

PEERS = [f"12D3KooW{chr(65 + i) * 44}" for i in range(3)]


def record(n: int, **changes) -> RoundRecord:
    """A round as a node with three peers writes it: about 1.1 KB of JSON."""
    values = dict(
        round=n,
        time=1765000000.0 + 8 * n,
        reward_mean=0.4375,
        cumulative_reward=0.4375 * n,
        format_rate=0.96875,
        accuracy=0.40625,
        per_task={"basic_arithmetic": 0.5, "propositional_logic": 0.375, "word_sorting": 0.4375},
        local_groups=4,
        external_groups=4,
        external_planned=4,
        external_reward_mean=0.3125,
        screened_out=1,
        inbox_size=37,
        received=40 * n,
        accepted=30 * n,
        rejected={"duplicate": 4 * n, "stale": 2 * n, "bad_signature": 12, "screened": 89},
        transport={
            "malformed_frames": 3,
            "inbox_channel_full": 0,
            "peers_banned": 1,
            "relay_circuits_limited": 2,
            "peers_without_discovery": 1,
            "relayed_links_recovered": 4,
        },
        published=4 * n,
        accepted_from={p: 6 * n for p in PEERS},
        peers=PEERS,
        generate_seconds=5.123,
        train_seconds=2.456,
        round_seconds=8.012,
        generated_tokens=8192,
        update_tokens=6144,
        tokens_per_second=1023.4,
        loss=0.01234,
        clip_fraction=0.0123,
    )
    return RoundRecord(**(values | changes))


def write_history(path, rounds: int) -> None:
    """`rounds` rows as an older release left them (no cap), fast: one row's JSON with its round
    number substituted, every 10th with a held-out accuracy."""
    plain, judged = (record(0, **extra).model_dump_json() for extra in ({}, {"heldout": {"basic_arithmetic": 0.5}}))
    head = '{"round":0,'
    assert plain.startswith(head) and judged.startswith(head)
    tails = ["," + plain[len(head) :] + "\n", "," + judged[len(head) :] + "\n"]
    with path.open("w") as f:
        for start in range(1, rounds + 1, 10_000):
            f.write("".join(f'{{"round":{n}{tails[n % 10 == 0]}' for n in range(start, min(rounds, start + 9_999) + 1)))


# What a resumed daemon reads of its history before its first round: Node.start_state's
# truncate_after, the page's curves (LiveStatus.node_ready) and `sapo-node status DATA_DIR`.
RESUME = """
import json, resource, sys
from pathlib import Path
from types import SimpleNamespace
from sapo.node.daemon.live import LoadedNode
from sapo.node.core.metrics import METRICS_FILE, MetricsLog
from sapo.node.core.settings import NodeSettings
from sapo.node.core.state import NodeState, RandomStreams
from sapo.node.daemon.status import status_from_data_dir
from sapo.sampling.balance import BalanceState
from tests.support.live import live_status

data_dir, last = Path(sys.argv[1]), int(sys.argv[2])
MetricsLog(data_dir / METRICS_FILE).truncate_after(last)
live = live_status(NodeSettings())
state = NodeState(round=last, balance=BalanceState(external=4), streams=RandomStreams.from_seed(0))
live.node_ready(LoadedNode(SimpleNamespace(data_dir=data_dir), None, state))
page = live._history.fields()["rounds"]
status = status_from_data_dir(data_dir)
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "round": status.round,
                  "page_last": page[-1].round, "points": len(page)}))
"""


def resume(data_dir, last: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", RESUME, str(data_dir), str(last)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[3],  # the checkout, where `tests.support` imports from
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_resuming_with_300000_rounds_peaks_within_200_mb_of_resuming_with_1000(tmp_path):
    """A month of 8-second rounds. Reading it whole took 3.3 GB (and 53 s) here: under docker's
    `restart: unless-stopped`, a crash loop."""
    runs = {}
    for rounds in (1_000, 300_000):
        data_dir = tmp_path / f"rounds-{rounds}"
        data_dir.mkdir()
        write_history(data_dir / METRICS_FILE, rounds)
        runs[rounds] = resume(data_dir, rounds - 3)  # the checkpoint was 3 rounds back
        assert runs[rounds]["round"] == runs[rounds]["page_last"] == rounds - 3
        path = data_dir / METRICS_FILE
        assert path.stat().st_size <= MetricsLog(path).max_bytes  # compacted on the way
        with path.open() as f:
            assert json.loads(f.readline())["round"] <= 64  # the history still begins at the start
    grown = runs[300_000]["peak_mb"] - runs[1_000]["peak_mb"]
    assert grown <= 200, f"resuming 300,000 rounds peaked {grown:.0f} MB above resuming 1,000 ({runs})"


def test_truncate_after_keeps_exactly_the_rounds_up_to_the_checkpoint(tmp_path):
    path = tmp_path / METRICS_FILE
    log = MetricsLog(path)
    for n in range(1, 21):
        log.append(record(n))
    whole = path.read_bytes().splitlines(keepends=True)
    with path.open("a") as f:
        f.write('{"round":21,"time":17650')  # killed mid-write
    log.truncate_after(12)
    assert path.read_bytes() == b"".join(whole[:12])  # the lines themselves, not re-encoded
    assert [p.name for p in tmp_path.iterdir()] == [METRICS_FILE]  # no temporary file left
    log.append(record(13))
    assert [json.loads(line)["round"] for line in path.read_text().splitlines()] == list(range(1, 14))
    MetricsLog(tmp_path / "none.jsonl").truncate_after(5)  # a node without history yet
    assert not (tmp_path / "none.jsonl").exists()


def test_a_row_appended_after_a_torn_line_is_whole(tmp_path):
    """A node without a checkpoint does not truncate; its first row must not join a torn one."""
    path = tmp_path / METRICS_FILE
    MetricsLog(path).append(record(1))
    with path.open("a") as f:
        f.write('{"round":2,"ti')
    MetricsLog(path).append(record(1))
    assert status_from_data_dir(tmp_path).rounds[-1].round == 1
    assert len(path.read_text().splitlines()) == 3


def test_the_file_stays_under_its_cap_and_status_still_reads_it(tmp_path):
    cap = 64 * 1024  # about 50 rows
    path = tmp_path / METRICS_FILE
    log = MetricsLog(path, max_bytes=cap)
    for n in range(1, 501):
        log.append(record(n, heldout={"basic_arithmetic": n / 1000} if n % 5 == 0 else None))
        assert path.stat().st_size <= cap
    rounds = [json.loads(line)["round"] for line in path.read_text().splitlines()]
    assert rounds[-20:] == list(range(481, 501))  # the newest rounds whole
    gaps = [b - a for a, b in zip(rounds, rounds[1:])]
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] == 1  # sparser the older, never out of order
    assert rounds[0] == gaps[0] <= 64  # and still from the start of the run
    assert [p.name for p in tmp_path.iterdir()] == [METRICS_FILE]

    status = status_from_data_dir(tmp_path)
    assert status.round == 500 and status.cumulative_reward == pytest.approx(0.4375 * 500)
    assert status.heldout_round == 500 and status.rounds[0].round == rounds[0]
    text = sapo_node("status", str(tmp_path))
    assert text.returncode == 0, text.stderr
    assert "round 500" in text.stdout and "held-out   0.500 at round 500" in text.stdout


def test_the_rewrite_is_on_disk_before_it_takes_the_name(tmp_path, monkeypatch):
    """fsync the new file, rename it, fsync the directory: a crash leaves the old file or the
    new one, never an empty one."""
    path = tmp_path / METRICS_FILE
    log = MetricsLog(path)
    for n in range(1, 4):
        log.append(record(n))
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (calls.append(("fsync", os.path.isdir(f"/proc/self/fd/{fd}"))), real_fsync(fd))
    )
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append(("replace", None)), real_replace(a, b)))
    log.truncate_after(2)
    assert calls == [("fsync", False), ("replace", None), ("fsync", True)]


def test_a_failed_compaction_leaves_the_file_and_the_round_goes_on(tmp_path, monkeypatch):
    path = tmp_path / METRICS_FILE
    log = MetricsLog(path, max_bytes=8 * 1024)
    for n in range(1, 6):
        log.append(record(n))
    before = path.read_bytes()

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("shutil.copyfileobj", full_disk)
    log.append(record(6))  # over the cap: the compaction fails, the row is kept
    assert path.read_bytes().startswith(before) and path.read_text().splitlines()[-1].startswith('{"round":6,')
    assert [p.name for p in tmp_path.iterdir()] == [METRICS_FILE]
