"""`sapo-node swarm`: N real processes, live progress, clean end."""

import re

from tests.support.processes import read_metrics, sapo_node


def test_swarm_of_three_tiny_nodes_ends_cleanly_with_external_groups(tmp_path):
    # 12 rounds: a node starts once its peers are connected, which can be a second before they
    # have loaded and published; a tiny round takes 0.2-0.3 s, so 5 rounds could all pass first
    # (it did once under the whole suite's load: the first node's 5 rounds ended in 1.0 s).
    result = sapo_node(
        "swarm",
        "--nodes",
        "3",
        "--data-dir",
        str(tmp_path),
        "--progress-every",
        "2",
        "--model",
        "tiny",
        "--rounds",
        "12",
        "--tasks",
        "basic_arithmetic",
        "--max-new-tokens",
        "24",
        "--warm-start-steps",
        "100",
        "--task-config",
        '{"basic_arithmetic": {"operators": ["+"]}}',
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "bootstrap node: /ip4/127.0.0.1/tcp/" in result.stdout
    assert "n0: r" in result.stdout  # live progress lines
    for i in range(3):
        # where to look: each node's page, and its log
        assert re.search(
            rf"^node {i}: page http://127\.0\.0\.1:\d+/  log {re.escape(str(tmp_path))}/node-{i}/node\.log$",
            result.stdout,
            re.M,
        ), result.stdout
        log = (tmp_path / f"node-{i}" / "node.log").read_text().splitlines()
        # the address first, then the loading, then the rounds, in the order they happened
        first = {
            what: next(n for n, line in enumerate(log) if what in line)
            for what in ("listening on", "model loaded", "round 1:")
        }
        assert first["listening on"] < first["model loaded"] < first["round 1:"], log[:20]
        rows = read_metrics(tmp_path / f"node-{i}")
        assert [r["round"] for r in rows] == list(range(1, 13))
        assert any(r["external_groups"] > 0 for r in rows), f"node {i} never used an external group"
    # one shared warm start, not three
    assert len(list((tmp_path / "models" / "warmstart").glob("tiny-*"))) == 1


def test_swarm_refuses_per_node_flags_it_sets_itself(tmp_path):
    result = sapo_node(
        "swarm", "--nodes", "2", "--data-dir", str(tmp_path), "--model", "tiny", "--listen", "/ip4/1.2.3.4/tcp/1"
    )
    assert result.returncode != 0 and "--listen" in result.stderr


def test_ctrl_c_stops_every_node_cleanly(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.support.processes import FAST_TINY, wait_for

    node_flags = [f for f in FAST_TINY if f not in ("--listen", "/ip4/127.0.0.1/tcp/0")]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sapo.node.cli",
            "swarm",
            "--nodes",
            "2",
            "--data-dir",
            str(tmp_path),
            "--progress-every",
            "1",
            *node_flags,
            "--rounds",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: all(read_metrics(tmp_path / f"node-{i}") for i in range(2)), timeout=120, what="both nodes to run"
        )
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-2000:] + err[-2000:]
    assert "stopping the swarm (you pressed Ctrl-C)" in out
    for i in range(2):
        log = (tmp_path / f"node-{i}" / "node.log").read_text()
        # each node's log says why it got a SIGTERM, before the node says it got one
        told = log.index("sapo-swarm: you pressed Ctrl-C in the swarm's terminal; sending this node SIGTERM")
        assert told < log.index("received SIGTERM") < log.index("finishing cleanly")
        rounds = [r["round"] for r in read_metrics(tmp_path / f"node-{i}")]
        # the clean stop checkpoints the last finished round
        assert (tmp_path / f"node-{i}" / "checkpoints" / f"round-{rounds[-1]:08d}").is_dir()
    time.sleep(0.5)
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.strip()
    assert not leftover, f"node processes survived: {leftover}"


async def test_a_node_log_is_rotated_and_its_oldest_part_dropped(tmp_path, monkeypatch):
    """A node that talks for weeks fills at most (backups + 1) x the cap: here a DEBUG-level node
    and a 2 KB cap stand in for a SmolLM2 node and 10 MiB."""
    from sapo.node import swarm
    from tests.support.processes import FAST_TINY

    cap = 2 << 10
    monkeypatch.setattr(
        swarm, "NODE_LOG_MAX_BYTES", cap, raising=False
    )  # raising=False: the test runs on a swarm without rotation too
    node_flags = [f for f in FAST_TINY if f not in ("--listen", "/ip4/127.0.0.1/tcp/0")]
    failed = await swarm.run_swarm(
        1, tmp_path, [*node_flags, "--rounds", "60", "--log-level", "DEBUG"], progress_every=1.0
    )
    assert failed == 0
    node = tmp_path / "node-0"
    kept = sorted(p.name for p in node.glob("node.log*"))
    assert kept == ["node.log", "node.log.1", "node.log.2"]
    for name in kept:
        content = (node / name).read_text()
        assert len(content.encode()) <= cap and content.endswith("\n"), name  # cut between lines, never inside one
    text = "".join((node / name).read_text() for name in ("node.log.2", "node.log.1", "node.log"))
    assert "round 60:" in text  # the newest lines are kept
    assert "listening on" not in text  # the oldest part is gone: the log is bounded


def test_nodes_end_when_their_swarm_is_killed_outright(tmp_path):
    # SIGKILL gives the swarm no chance to forward anything: the kernel tells each node instead,
    # and it stops as on Ctrl-C (a clean stop, with a checkpoint), not orphaned and training on.
    import signal
    import subprocess
    import sys
    import time

    from tests.support.processes import FAST_TINY, wait_for

    node_flags = [f for f in FAST_TINY if f not in ("--listen", "/ip4/127.0.0.1/tcp/0")]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sapo.node.cli",
            "swarm",
            "--nodes",
            "1",
            "--data-dir",
            str(tmp_path),
            *node_flags,
            "--rounds",
            "0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: read_metrics(tmp_path / "node-0"), timeout=180, what="the node to run")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    survivors = lambda: subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()  # noqa: E731
    try:
        wait_for(lambda: not survivors(), timeout=60, what="the orphaned node to stop")
    finally:
        for pid in survivors():
            subprocess.run(["kill", "-9", pid], check=False)
    time.sleep(0.2)
    assert list((tmp_path / "node-0" / "checkpoints").glob("round-*")), "the node did not stop cleanly"


def test_the_progress_line_reads_only_the_end_of_a_long_metrics_file(tmp_path):
    """Read every few seconds for as long as the swarm runs: the cost must not grow with the run."""
    import json
    import tracemalloc

    from sapo.node.swarm import latest_metrics

    row = {"round": 1, "reward_mean": 0.5, "external_groups": 2, "peers": ["a", "b"], "padding": "x" * 900}
    with (tmp_path / "metrics.jsonl").open("w") as f:
        for n in range(1, 30_001):  # ~30 MB: a month of SmolLM2 rounds
            f.write(json.dumps(row | {"round": n}) + "\n")
        f.write('{"round": 30001, "rew')  # a line being written
    tracemalloc.start()
    try:
        last = latest_metrics(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert last["round"] == 30_000
    assert peak < 2 << 20, f"{peak / 2**20:.0f} MB held to find the last line"
