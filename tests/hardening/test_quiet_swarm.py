"""Quiet when all is well: a 3-node `sapo-node swarm` on loopback runs for a minute and no node
writes an ERROR line. The three nodes dial each other at once and ask each other to dial them
back (AutoNAT); on main every node.log began with `ERROR libp2p.network.swarm: fail to upgrade
mux for peer ...`, which a dial-back that hung up after the Noise handshake caused."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.support.processes import FAST_TINY, read_metrics, wait_for

SECONDS = 60.0


def test_a_three_node_swarm_runs_a_minute_without_an_error_line(tmp_path):
    node_flags = [f for f in FAST_TINY if f not in ("--listen", "/ip4/127.0.0.1/tcp/0")]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sapo.node.cli",
            "swarm",
            "--nodes",
            "3",
            "--data-dir",
            str(tmp_path),
            "--progress-every",
            "10",
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
            lambda: all(read_metrics(tmp_path / f"node-{i}") for i in range(3)) or proc.poll() is not None,
            timeout=240,
            what="all three nodes to finish a round",
        )
        assert proc.poll() is None, proc.communicate()[0][-2000:]
        time.sleep(SECONDS)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-2000:] + err[-2000:]
    errors, lines = {}, 0
    for i in range(3):
        log = (tmp_path / f"node-{i}" / "node.log").read_text().splitlines()
        lines += len(log)
        errors[i] = [line for line in log if " ERROR " in line]
        rows = read_metrics(tmp_path / f"node-{i}")
        assert len(rows[-1]["peers"]) == 2, f"node {i} is not connected to both others: {rows[-1]['peers']}"
    print(f"\nquiet swarm: {lines} log lines in 3 nodes, ERROR lines per node {[len(e) for e in errors.values()]}")
    assert not any(errors.values()), {i: e[:3] for i, e in errors.items() if e}
