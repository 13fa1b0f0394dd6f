"""Faults a real node must survive: kill -9, a crash inside a checkpoint write, a full disk,
an unusable data dir, and a bootstrap peer that is down at start or goes away and returns."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of
from sapo.training.learning.checkpoints import PARTIAL_PREFIX, latest_checkpoint, save_checkpoint, verify_checkpoint
from tests.support.processes import PLUMBING, TINY, NodeProcess, free_port, sapo_node, since, wait_for, wait_rounds


def round_dirs(root):
    return sorted(p for p in root.iterdir() if p.name.startswith("round-")) if root.is_dir() else []


def test_kill_9_mid_round_resumes_from_the_last_checkpoint(tmp_path, nodes):
    data = tmp_path / "n"
    args = ["--rounds", "0", "--checkpoint-every", "2"]
    node = NodeProcess(data, args)
    nodes.append(node)
    wait_rounds(node, 7, timeout=90)
    node.stop(signal.SIGKILL)
    killed_at = time.time()
    last_before = node.last_round()
    checkpoints = data / "checkpoints"
    for path in round_dirs(checkpoints):
        verify_checkpoint(path)
    resumed_from = latest_checkpoint(checkpoints).round
    assert resumed_from % 2 == 0 and 0 < last_before - resumed_from + 2 <= 4, (last_before, resumed_from)

    again = NodeProcess(data, args)
    nodes.append(again)
    assert again.peer_id == node.peer_id
    wait_rounds(again, 3, timeout=90)
    again.stop()
    rows = again.metrics()
    rounds = [r["round"] for r in rows]
    # truncated to the checkpoint, then continued: one row per round, none lost, none doubled
    assert rounds == list(range(1, len(rounds) + 1)), rounds
    assert all(r["time"] < killed_at for r in rows if r["round"] <= resumed_from)
    assert all(r["time"] > killed_at for r in rows if r["round"] > resumed_from)
    assert "resumed from" in again.log_text()
    assert round_dirs(checkpoints)
    for path in round_dirs(checkpoints):
        verify_checkpoint(path)


CRASH_IN_WRITE = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from sapo.training.learning.checkpoints import save_checkpoint

    def write_model(path):
        path.mkdir()
        with open(path / "model.safetensors", "wb") as f:
            f.write(b"w" * 200_000)
            f.flush()
            os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)   # die half-way through the checkpoint

    save_checkpoint(Path(sys.argv[1]), 4, write_model, {"step": 4}, {"round": 4})
""")


def test_crash_during_a_checkpoint_write_keeps_the_previous_one(tmp_path):
    root = tmp_path / "checkpoints"

    def good_model(path):
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"g" * 1000)

    save_checkpoint(root, 2, good_model, {"step": 2}, {"round": 2})
    child = subprocess.run([sys.executable, "-c", CRASH_IN_WRITE, str(root)], capture_output=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    assert any(p.name.startswith(PARTIAL_PREFIX) for p in root.iterdir()), "the crash should leave a partial"
    checkpoint = latest_checkpoint(root)
    assert checkpoint.round == 2
    verify_checkpoint(checkpoint.path)
    assert not any(p.name.startswith(PARTIAL_PREFIX) for p in root.iterdir())
    assert [p.name for p in round_dirs(root)] == ["round-00000002"]


CRASH_IN_PRUNE = textwrap.dedent("""
    import os, shutil, signal, sys
    from pathlib import Path
    from sapo.training.learning.checkpoints import save_checkpoint

    def model(path):
        path.mkdir()
        for name in ("model.safetensors", "tokenizer.json", "config.json"):
            (path / name).write_bytes(name.encode() * 100)

    root = Path(sys.argv[1])
    for r in (2, 4, 6):
        save_checkpoint(root, r, model, {"step": r}, {"round": r}, keep=3)

    real_rmtree = shutil.rmtree

    def rmtree(path, ignore_errors=False):  # a deletion gets one file in, then the node dies
        files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else []
        if not files:
            return real_rmtree(path, ignore_errors=ignore_errors)
        files[0].unlink()
        os.kill(os.getpid(), signal.SIGKILL)

    shutil.rmtree = rmtree
    save_checkpoint(root, 8, model, {"step": 8}, {"round": 8}, keep=3)   # prunes round 2
""")


def test_a_kill_while_pruning_leaves_no_checkpoint_half_deleted(tmp_path):
    # kill -9 can land while the oldest checkpoint is being deleted (a node checkpoints, then
    # prunes): what is left must be whole checkpoints and a partial, never round-2 missing a file
    root = tmp_path / "checkpoints"
    child = subprocess.run([sys.executable, "-c", CRASH_IN_PRUNE, str(root)], capture_output=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    for path in round_dirs(root):
        verify_checkpoint(path)
    assert [p.name for p in round_dirs(root)] == ["round-00000004", "round-00000006", "round-00000008"]
    assert latest_checkpoint(root).round == 8
    assert not any(p.name.startswith(PARTIAL_PREFIX) for p in root.iterdir())  # the start clears it


@pytest.fixture
def small_tmpfs(tmp_path):
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a 2 MB tmpfs here (needs root/CAP_SYS_ADMIN): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_full_disk_is_a_clear_error_and_leaves_no_half_checkpoint(small_tmpfs):
    data = small_tmpfs / "node"
    # a tiny-model checkpoint is about 4 MB: it cannot fit in 2 MB
    result = sapo_node(
        "start",
        *TINY,
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--rounds",
        "3",
        "--checkpoint-every",
        "2",
        "--data-dir",
        str(data),
        timeout=120,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("sapo-node: error:")]
    assert error and "space" in error[0].lower() and "round-00000002" in error[0], result.stderr[-2000:]
    checkpoints = data / "checkpoints"
    assert not round_dirs(checkpoints)
    assert not any(p.name.startswith(PARTIAL_PREFIX) for p in checkpoints.iterdir())


def test_a_file_where_the_data_dir_should_be_is_a_clear_error(tmp_path):
    data = tmp_path / "not-a-dir"
    data.write_text("oops")
    result = sapo_node(
        "start", *TINY, "--listen", "/ip4/127.0.0.1/tcp/0", "--rounds", "1", "--data-dir", str(data), timeout=60
    )
    assert result.returncode == 2, result.stderr[-3000:]  # refused with the settings, before anything loads
    assert "Traceback" not in result.stderr
    assert "sapo-node: invalid settings:" in result.stderr and str(data) in result.stderr, result.stderr[-2000:]
    assert data.read_text() == "oops"


def test_bootstrap_peer_down_at_start_then_up_then_away_and_back(tmp_path, nodes):
    port = free_port()
    boot_dir = tmp_path / "boot"
    boot_id = peer_id_of(load_or_create_identity(boot_dir))  # its key exists before it ever runs
    boot_listen = f"/ip4/127.0.0.1/tcp/{port}"
    learner = NodeProcess(tmp_path / "learner", [*PLUMBING, "--peers", f"{boot_listen}/p2p/{boot_id}"])
    nodes.append(learner)

    wait_rounds(learner, 5, timeout=60)  # trains alone while its only peer is down
    assert all(boot_id not in r["peers"] for r in learner.metrics())

    def hears_boot(after: float):
        assert boot.alive(), f"the bootstrap peer died:\n{boot.log_text()[-3000:]}"
        rows = since(learner.metrics(), after)
        return rows and boot_id in rows[-1]["peers"] and rows[-1]["accepted_from"].get(boot_id, 0) > seen_before

    seen_before = 0
    up_at = time.time()
    boot = NodeProcess(boot_dir, [*PLUMBING], listen=boot_listen)
    nodes.append(boot)
    assert boot.peer_id == boot_id
    wait_for(lambda: hears_boot(up_at), timeout=60, interval=0.3, what="the learner to connect and receive")
    print(f"\nconnected to the late bootstrap peer {time.time() - up_at:.1f}s after it started")

    boot.stop(signal.SIGKILL)
    gone_at = time.time()
    wait_for(
        lambda: (rows := since(learner.metrics(), gone_at + 1)) and boot_id not in rows[-1]["peers"],
        timeout=30,
        interval=0.3,
        what="the learner to notice the peer left",
    )
    wait_rounds(learner, 5, timeout=30)  # keeps training alone
    seen_before = learner.metrics()[-1]["accepted_from"].get(boot_id, 0)

    back_at = time.time()
    boot = NodeProcess(boot_dir, [*PLUMBING], listen=boot_listen)
    nodes.append(boot)
    wait_for(lambda: hears_boot(back_at), timeout=60, interval=0.3, what="the learner to reconnect and receive again")
    print(f"reconnected {time.time() - back_at:.1f}s after the peer came back")
    assert learner.alive()
