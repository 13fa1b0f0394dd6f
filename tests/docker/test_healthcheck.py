"""docker/healthcheck.py, the image's HEALTHCHECK, against a real node page server and a real
listening socket. (In a container, under a real engine: `make compose-test` waits for every
sapo container to turn healthy.)"""

import importlib.util
import json
import socket
import time
from pathlib import Path

import pytest
import trio

from sapo.node.daemon.prometheus import NodeMetrics
from sapo.node.daemon.status import NodeStatus
from sapo.node.daemon.web import serve_page

SCRIPT = Path(__file__).resolve().parents[2] / "docker" / "healthcheck.py"
spec = importlib.util.spec_from_file_location("sapo_healthcheck", SCRIPT)
healthcheck = importlib.util.module_from_spec(spec)
spec.loader.exec_module(healthcheck)


def write_status(data_dir: Path, **fields) -> None:
    (data_dir / "status.json").write_text(json.dumps({"updated": time.time(), "peer_id": "12D3KooWme", **fields}))


@pytest.mark.parametrize("phase, healthy", [("training", True), ("loading model", True), ("stopped", False)])
async def test_a_node_is_healthy_while_its_page_answers_and_it_has_not_stopped(tmp_path, phase, healthy):
    status = NodeStatus(source="live", updated=time.time(), peer_id="12D3KooWme", phase=phase)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_page, NodeMetrics(), lambda: status, "127.0.0.1", 0)
        write_status(tmp_path, page=[f"http://127.0.0.1:{port}/"])
        args = ["start", "--data-dir", str(tmp_path)]
        if healthy:
            said = await trio.to_thread.run_sync(healthcheck.check_node, args)
            assert said == f"node 12D3KooWme: {phase}, round 0"
        else:
            with pytest.raises(SystemExit, match="unhealthy: .*stopped"):
                await trio.to_thread.run_sync(healthcheck.check_node, args)
        nursery.cancel_scope.cancel()


def test_a_node_whose_page_is_gone_or_not_yet_written_is_unhealthy(tmp_path):
    args = ["start", "--data-dir", str(tmp_path)]
    with pytest.raises(SystemExit, match="no readable .*status.json"):
        healthcheck.check_node(args)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    write_status(tmp_path, page=[f"http://127.0.0.1:{port}/"])
    with pytest.raises(SystemExit, match=f"unhealthy: http://127.0.0.1:{port}/api/status"):
        healthcheck.check_node(args)


def test_a_node_without_a_page_is_judged_by_how_fresh_its_status_file_is(tmp_path, monkeypatch):
    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path))  # the image's default data dir setting
    write_status(tmp_path, phase="training")
    assert "training" in healthcheck.check_node(["start"])
    write_status(tmp_path, phase="training", updated=time.time() - 600)
    with pytest.raises(SystemExit, match=r"status.json is \d+s old"):
        healthcheck.check_node(["start"])


def test_the_judge_is_healthy_while_its_port_accepts_connections():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert healthcheck.check_judge(["judge", "--listen", f"/ip4/127.0.0.1/tcp/{port}"]).endswith(
            f"127.0.0.1:{port}"
        )
    with pytest.raises(SystemExit, match=f"judge port 127.0.0.1:{port}"):
        healthcheck.check_judge(["judge", "--listen", f"/ip4/127.0.0.1/tcp/{port}"])
