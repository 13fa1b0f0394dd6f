"""The live page of a real node, as a browser renders it, and the same status from the
terminal: two tiny node processes gossiping on 127.0.0.1, the first serving its page."""

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from sapo.node.daemon.status import NodeStatus, status_from_url
from tests.support.processes import PLUMBING, NodeProcess, page_url, sapo_node, wait_for, with_peers

CHROMIUM = next(
    (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None
)
# CI (.ci/run) installs Chromium and sets SAPO_REQUIRE_CHROMIUM, so there a missing browser fails instead.
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("SAPO_REQUIRE_CHROMIUM"),
    reason="headless Chromium is not installed (Debian: apt-get install -y chromium; .ci/run installs it)",
)
DASHBOARD = Path(__file__).resolve().parents[3] / "docker" / "monitoring" / "grafana" / "dashboards" / "sapo.json"


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """Node a (page on, held-out eval every 2 rounds) and node b, a's peer; once a has
    trained on b's groups for a few rounds."""
    root = tmp_path_factory.mktemp("watched")
    started = []
    try:
        a = NodeProcess(root / "a", [*PLUMBING, "--metrics-port", "0", "--eval-every", "2", "--eval-questions", "2"])
        started.append(a)
        url = page_url(a)
        b = NodeProcess(root / "b", with_peers(PLUMBING, [a.address]))
        started.append(b)

        def a_learns_from_b():
            status = status_from_url(url)
            rows = {p.peer_id: p for p in status.peers}
            return status.round >= 4 and b.peer_id in rows and rows[b.peer_id].accepted > 0 and status

        wait_for(a_learns_from_b, timeout=180, interval=1, what="node a to run 4 rounds and accept groups from b")
        yield a, b, url
    finally:
        for node in started:  # both at once: each finishes its step and checkpoints
            node.proc.send_signal(signal.SIGTERM)
        for node in started:
            node.stop()


def chromium(url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    """Headless Chromium, isolated and quiet; --virtual-time-budget lets the page's fetch of
    /api/status and its drawing finish before the DOM is dumped or the screenshot taken."""
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=5000",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )


@needs_chromium
def test_the_page_draws_the_curves_and_lists_the_peer(watched, tmp_path):
    a, b, url = watched
    assert CHROMIUM is not None, "SAPO_REQUIRE_CHROMIUM is set but no chromium is on PATH"
    dom = chromium(url, tmp_path / "profile", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    points = {s: int(n) for s, n in re.findall(r'data-series="([\w-]+)" data-points="(\d+)"', html)}
    for series in ("reward", "accuracy", "format", "generate", "train"):
        assert points.get(series, 0) >= 4, f"the {series} curve has {points.get(series)} points"
    assert points.get("heldout", 0) >= 2  # --eval-every 2
    assert f'data-peer="{b.peer_id}"' in html  # the peer table's row for b
    assert re.search(r'id="phase"[^>]*>training<', html)
    assert "node unreachable" not in html

    shot = tmp_path / "page.png"
    result = chromium(url, tmp_path / "profile", "--hide-scrollbars", "--window-size=1100,1900", f"--screenshot={shot}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("SAPO_PAGE_SCREENSHOT"):  # where a person wants to look at it
        shutil.copy(shot, os.environ["SAPO_PAGE_SCREENSHOT"])


def test_the_page_serves_only_its_own_files(watched):
    _, _, url = watched
    html = urllib.request.urlopen(url, timeout=10).read().decode()
    for src in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert src.startswith(("/", "data:")), f"the page loads {src} from elsewhere"
        if src.startswith("/"):
            assert urllib.request.urlopen(url.rstrip("/") + src, timeout=10).status == 200


def test_status_command_against_the_running_node(watched):
    a, b, url = watched
    text = sapo_node("status", "--url", url, timeout=60)
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert f"node {a.peer_id} (tiny): training" in out
    assert b.peer_id[:12] in out and "accepted" in out and "/ip4/127.0.0.1/tcp/" in out
    assert "held-out" in out and "round time" in out
    from_files = sapo_node("status", str(a.data_dir), timeout=60)
    assert from_files.returncode == 0 and "status from files" in from_files.stdout
    assert b.peer_id[:12] in from_files.stdout
    live = NodeStatus.model_validate_json(sapo_node("status", "--url", url, "--json", timeout=60).stdout)
    assert live.source == "live" and live.listen == [a.address]


def test_the_dashboard_queries_only_metrics_the_node_exports(watched):
    """Every sapo_* name in a Grafana panel is declared by the real node's /metrics."""
    _, _, url = watched
    body = urllib.request.urlopen(url + "metrics", timeout=10).read().decode()
    declared = set(re.findall(r"^# TYPE (\S+) ", body, re.M))
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        name for panel in dashboard["panels"] for t in panel["targets"] for name in re.findall(r"\bsapo_\w+", t["expr"])
    }
    assert queried and queried <= declared, f"not exported: {sorted(queried - declared)}"
    assert re.search(r'^sapo_node_info\{.*peer_id="12D3', body, re.M)
