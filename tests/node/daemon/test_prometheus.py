import re
import signal
import subprocess
import sys
import urllib.request

from tests.support.processes import FAST_TINY, read_metrics, wait_for

EXPECTED = [
    "sapo_round",
    "sapo_local_reward",
    "sapo_local_reward_ma",
    "sapo_cumulative_reward",
    "sapo_inbox_groups",
    "sapo_received_groups_total",
    "sapo_rejected_groups_total",
    "sapo_published_groups_total",
    "sapo_connected_peers",
    "sapo_generation_tokens_per_second",
    "sapo_step_seconds",
]


def test_running_node_serves_prometheus_metrics(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sapo.node.cli",
            "start",
            *FAST_TINY,
            "--rounds",
            "0",
            "--data-dir",
            str(tmp_path),
            "--metrics-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = wait_for(lambda: _metrics_url(proc), timeout=120, interval=0, what="the metrics address")
        wait_for(lambda: len(read_metrics(tmp_path)) >= 2, timeout=120, what="two rounds")
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        for name in EXPECTED:
            assert f"# TYPE {name} " in body, f"{name} missing"
            if name != "sapo_rejected_groups_total":  # labelled by reason: no sample until a rejection
                assert re.search(rf"^{name}(\{{[^}}]*\}})? ", body, re.M), f"{name} has no sample"
        rounds = float(re.search(r"^sapo_round (\S+)", body, re.M).group(1))
        assert rounds >= 1
        assert 'sapo_step_seconds{phase="generate"}' in body
        missing = urllib.request.Request(url.replace("/metrics", "/nope"))
        try:
            urllib.request.urlopen(missing, timeout=10)
            raise AssertionError("expected 404")
        except urllib.error.HTTPError as err:
            assert err.code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _metrics_url(proc):
    line = proc.stdout.readline()
    match = re.search(r"metrics on (http://\S+/metrics)", line)
    return match.group(1) if match else None


def test_the_accepted_from_series_follow_the_peers_the_node_still_counts():
    from sapo.node.core.counters import NodeCounters, RecentPeerCounts
    from sapo.node.daemon.prometheus import NodeMetrics
    from tests.support.records import record

    counters = NodeCounters(accepted_from=RecentPeerCounts(limit=2))
    metrics = NodeMetrics()
    exported = []
    for peer in ("alice", "bob", "alice", "carol"):  # carol makes bob the one counted longest ago
        counters.accepted_from[peer] += 1
        metrics.observe(record(1, accepted_from=dict(counters.accepted_from)))
        exported.append(
            sorted(re.findall(r'sapo_accepted_groups_from_total\{peer="(\w+)"\} (\S+)', metrics.render().decode()))
        )
    assert exported == [
        [("alice", "1.0")],
        [("alice", "1.0"), ("bob", "1.0")],
        [("alice", "2.0"), ("bob", "1.0")],
        [("alice", "2.0"), ("carol", "1.0")],
    ]


def test_a_node_counts_groups_for_the_1024_peers_it_counted_last():
    from sapo.node.core.counters import NodeCounters
    from sapo.sampling.strategies import PEER_LIMIT

    counters = NodeCounters()
    for n in range(3 * PEER_LIMIT):
        counters.accepted_from["first"] += 1  # a peer that keeps sending is never forgotten
        counters.accepted_from[f"peer-{n}"] += 1
    assert len(counters.accepted_from) == PEER_LIMIT
    assert counters.accepted_from["first"] == 3 * PEER_LIMIT
    assert f"peer-{3 * PEER_LIMIT - 1}" in counters.accepted_from and "peer-0" not in counters.accepted_from
