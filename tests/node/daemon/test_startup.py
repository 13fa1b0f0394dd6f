"""A node opens its network before it loads its model: it prints the address peers dial,
peers connect and its page shows the loading progress meanwhile; what peers send while it
loads waits for the intake; Ctrl-C during the warm start stops it at once."""

import signal

from sapo.node.daemon.status import status_from_data_dir, status_from_url
from tests.support.processes import PLUMBING, NodeProcess, page_url, wait_for, with_peers


def test_a_warm_starting_node_is_dialable_shows_its_progress_and_keeps_what_peers_send(tmp_path, nodes):
    a = NodeProcess(tmp_path / "a", PLUMBING)  # no warm start: publishing within seconds
    nodes.append(a)
    slow = [*PLUMBING, "--warm-start-steps", "40", "--models-dir", str(tmp_path / "models"), "--metrics-port", "0"]
    b = NodeProcess(tmp_path / "b", with_peers(slow, [a.address]))
    nodes.append(b)
    # b has printed the address peers dial, and has not trained yet
    assert not (b.data_dir / "metrics.jsonl").exists()
    url = page_url(b)
    seen = []

    def loaded():
        seen.append(status_from_url(url))
        return seen[-1].phase in ("waiting for peers", "training")

    wait_for(loaded, timeout=180, interval=0.2, what="b to load its model")
    loading = [s for s in seen if s.phase == "warm start"]
    assert loading, [s.phase for s in seen]
    assert loading[-1].progress.total == 40 and 0 < loading[-1].progress.done <= 40
    assert loading[-1].progress.seconds_left is not None
    assert any(any(p.peer_id == a.peer_id and p.connected for p in s.peers) for s in loading), (
        "a connected during the warm start"
    )
    assert any(s.waiting_while_loading > 0 for s in loading), "a's groups waited for b's intake"
    # then b checks what waited, and trains on it
    wait_for(
        lambda: (b.metrics() or [{}])[-1].get("accepted_from", {}).get(a.peer_id, 0) > 0 or not b.alive(),
        timeout=120,
        what="b to accept a's groups",
    )
    assert b.alive(), b.log_text()[-3000:]
    assert "Traceback" not in b.log_text()


def test_ctrl_c_during_the_warm_start_stops_at_once_and_caches_nothing(tmp_path):
    models = tmp_path / "models"
    node = NodeProcess(
        tmp_path / "n",
        ["--warm-start-steps", "5000", "--models-dir", str(models), "--metrics-port", "0", "--rounds", "1"],
    )
    try:
        url = page_url(node)
        wait_for(lambda: status_from_url(url).phase == "warm start", timeout=120, interval=0.2, what="the warm start")
        node.proc.send_signal(signal.SIGINT)
        assert node.proc.wait(60) == 0
    finally:
        node.stop(signal.SIGKILL)
    log = node.log_text()
    assert "received SIGINT (Ctrl-C)" in log and "stopped during the warm start" in log
    assert not list(models.glob("warmstart/*/recipe.json"))
    assert status_from_data_dir(node.data_dir).phase == "stopped"
