"""A judge process and two node processes on 127.0.0.1, through the real CLI."""

import re
import signal
import subprocess
import sys
from pathlib import Path

from sapo.node.daemon.status import status_from_data_dir
from sapo.node.judge.server import DB_FILE_NAME, load_results
from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of
from tests.support.processes import LOOPBACK_LISTEN, free_port, sapo_node, start_node, stop_process, wait_for

JUDGE_LISTEN = re.compile(r"judge listening on (/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)")


class JudgeProcess:
    """Started without waiting, so the nodes' start-up overlaps the judge's."""

    def __init__(self, data_dir: Path, listen: str = LOOPBACK_LISTEN):
        self.data_dir = data_dir
        self.log = (data_dir.parent / f"{data_dir.name}.log").open("a")
        args = [
            sys.executable,
            "-m",
            "sapo.node.cli",
            "judge",
            "--data-dir",
            str(data_dir),
            "--listen",
            listen,
            "--tasks",
            "basic_arithmetic",
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)

    def wait_listening(self) -> str:
        return wait_for(self._listen_line, timeout=60, interval=0, what="the judge to listen").group(1)

    def _listen_line(self):
        line = self.proc.stdout.readline()
        if not line and self.proc.poll() is not None:
            raise AssertionError(f"judge exited early with code {self.proc.returncode}; see {self.log.name}")
        return JUDGE_LISTEN.search(line)

    def stop(self, sig=signal.SIGTERM, timeout=30) -> int:
        code = stop_process(self.proc, sig, timeout)
        self.log.close()
        return code


def judged_counts(data_dir: Path) -> dict[str, int]:
    path = data_dir / DB_FILE_NAME
    counts: dict[str, int] = {}
    for row in load_results(path) if path.exists() else []:
        counts[row["peer_id"]] = counts.get(row["peer_id"], 0) + 1
    return counts


def test_two_nodes_are_judged_and_results_survive_a_judge_restart(tmp_path, nodes):
    judge_dir = tmp_path / "judge"
    # The judge's identity and port are known up front, so the nodes can start alongside it
    # (an evaluation due before the judge is up is only logged: that path runs here too).
    judge_id = peer_id_of(load_or_create_identity(judge_dir))
    port = free_port()
    address = f"/ip4/127.0.0.1/tcp/{port}/p2p/{judge_id}"
    judge = JudgeProcess(judge_dir, f"/ip4/127.0.0.1/tcp/{port}")
    nodes.append(judge)
    extra = ["--local", "1", "--external", "1", "--rounds", "0", "--judge", address, "--judge-every", "1"]
    first = start_node(tmp_path / "n0", [], extra)
    nodes.append(first)
    second = start_node(tmp_path / "n1", [first.address], extra)
    nodes.append(second)
    assert judge.wait_listening() == address

    wait_for(
        lambda: all(judged_counts(judge_dir).get(n.peer_id, 0) >= 2 for n in (first, second)),
        timeout=90,
        what="both nodes to be judged twice",
    )

    # what the node's page and `sapo-node status` show: its latest pass@1 (status.json, every 5 s)
    def judged_in_status(node):
        judge = status_from_data_dir(node.data_dir).judge
        return (
            judge is not None
            and judge.judged >= 1
            and 0.0 <= judge.last_score <= 1.0
            and judge.address == address
            and judge.scores
        )

    wait_for(lambda: judged_in_status(first), timeout=30, what="the node's status to show the judge's score")
    for node in (first, second):
        node.stop()
    assert judge.stop() == 0
    before = load_results(judge_dir / DB_FILE_NAME)
    assert {r["peer_id"] for r in before} == {first.peer_id, second.peer_id}
    assert all(r["task"] == "basic_arithmetic" and 0.0 <= r["score"] <= 1.0 and r["model_id"] for r in before)

    # Same data dir: same judge identity, and every committed row is still there.
    restarted = JudgeProcess(judge_dir)
    nodes.append(restarted)
    assert restarted.wait_listening().endswith(f"/p2p/{judge_id}")
    assert load_results(judge_dir / DB_FILE_NAME) == before
    assert restarted.stop() == 0

    png = tmp_path / "judge.png"
    report = sapo_node("judge", "report", "--data-dir", str(judge_dir), "--out", str(png), timeout=120)
    assert report.returncode == 0, report.stderr
    assert first.peer_id in report.stdout and second.peer_id in report.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
