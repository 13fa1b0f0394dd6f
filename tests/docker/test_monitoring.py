"""`--profile monitoring`: Prometheus scrapes every node, Grafana shows a provisioned
dashboard. No Docker engine runs here, so this is checked statically, like the rest of the
compose file, and the dashboard's queries against what a real /metrics server exports."""

import json
import re
import urllib.request
from pathlib import Path

import trio
import yaml

from sapo.node.core.metrics import RoundRecord
from sapo.node.daemon.prometheus import NodeMetrics
from sapo.node.daemon.status import JudgeStatus, NodeStatus
from sapo.node.daemon.web import serve_page

DOCKER = Path(__file__).resolve().parents[2] / "docker"
COMPOSE = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
DASHBOARD = DOCKER / "monitoring" / "grafana" / "dashboards" / "sapo.json"


def mounts(service: str) -> dict[str, Path]:
    """container path -> the repo file or folder mounted there (bind mounts only)."""
    found = {}
    for volume in SERVICES[service]["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            found[target] = DOCKER / source
    return found


def test_monitoring_services_sit_behind_their_profile_and_mount_files_that_exist():
    for name in ("prometheus", "grafana"):
        service = SERVICES[name]
        assert service["profiles"] == ["monitoring"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", service["image"]), "pin the image's version"
        for source in mounts(name).values():
            assert source.exists(), f"{name} mounts {source}, which is not in the repo"
    # a plain `up` starts no monitoring
    assert all(
        "monitoring" not in s.get("profiles", []) for n, s in SERVICES.items() if n not in ("prometheus", "grafana")
    )
    for volume in ("prometheus-data", "grafana-data"):
        assert volume in COMPOSE["volumes"]


def test_prometheus_scrapes_the_port_every_node_serves_metrics_on():
    config = yaml.safe_load(mounts("prometheus")["/etc/prometheus/prometheus.yml"].read_text())
    assert "--config.file=/etc/prometheus/prometheus.yml" in SERVICES["prometheus"]["command"]
    (job,) = config["scrape_configs"]
    (sd,) = job["dns_sd_configs"]
    nodes = {name for name, s in SERVICES.items() if s.get("command", [""])[0] == "start"}
    assert set(sd["names"]) == nodes, "every node service, and only those, is scraped"
    for name in nodes:
        command = [str(c) for c in SERVICES[name]["command"]]
        assert command[command.index("--metrics-port") + 1] == str(sd["port"])
        assert command[command.index("--metrics-host") + 1] == "0.0.0.0"  # reachable from the prometheus container


def test_grafana_provisions_the_prometheus_datasource_and_the_dashboard():
    grafana = mounts("grafana")
    provisioning = grafana["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert datasource["url"] == "http://prometheus:9090" and datasource["type"] == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "sapo.yml").read_text())["providers"]
    folder = provider["options"]["path"]
    assert grafana[folder] == DASHBOARD.parent
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{folder}/{DASHBOARD.name}"
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == datasource["uid"], panel["title"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def a_round() -> RoundRecord:
    return RoundRecord(
        round=3,
        time=1.0,
        reward_mean=0.5,
        cumulative_reward=1.0,
        format_rate=0.9,
        accuracy=0.4,
        heldout={"basic_arithmetic": 0.3},
        per_task={"basic_arithmetic": 0.5},
        local_groups=2,
        external_groups=2,
        external_reward_mean=0.25,
        inbox_size=5,
        received=9,
        accepted=7,
        rejected={"duplicate": 2},
        transport={"peers_banned": 1},
        published=4,
        accepted_from={"12D3KooWpeer": 7},
        peers=["12D3KooWpeer"],
        generate_seconds=1.0,
        train_seconds=0.5,
        round_seconds=1.6,
        generated_tokens=10,
        tokens_per_second=10.0,
        loss=0.1,
        clip_fraction=0.0,
    )


async def test_every_dashboard_query_names_a_metric_the_node_exports():
    """Scrape the node's own HTTP server (web.py, in this process) after one round, and
    check each panel's sapo_* names against the samples it really exports."""
    metrics = NodeMetrics()
    metrics.observe(a_round())
    status = NodeStatus(
        source="live",
        updated=1.0,
        peer_id="12D3KooWme",
        model="tiny",
        phase="training",
        judge=JudgeStatus(
            address="/ip4/127.0.0.1/tcp/4101/p2p/12D3KooWjudge", every=10, last_round=3, last_score=1.0, judged=1
        ),
    )
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_page, metrics, lambda: status, "127.0.0.1", 0)
        with trio.fail_after(30):
            body = await trio.to_thread.run_sync(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            )
        nursery.cancel_scope.cancel()
    samples = set(re.findall(r"^(sapo_\w+)(?:\{[^}]*\})? ", body, re.M))
    # (prometheus_client adds a *_created gauge to each counter: when it was made, nothing to plot)
    families = {f for f in re.findall(r"^# TYPE (sapo_\w+) ", body, re.M) if not f.endswith("_created")}
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names = set(re.findall(r"\bsapo_\w+", target["expr"]))
            assert names, f"{panel['title']}: {target['expr']} names no sapo metric"
            assert names <= samples, f"{panel['title']}: {sorted(names - samples)} not exported"
    # and the dashboard shows every family the node exports
    shown = {n for p in dashboard["panels"] for t in p["targets"] for n in re.findall(r"\bsapo_\w+", t["expr"])}
    assert {f.removesuffix("_total") for f in families} <= {n.removesuffix("_total") for n in shown}, (
        f"exported but on no panel: {sorted({f.removesuffix('_total') for f in families} - {n.removesuffix('_total') for n in shown})}"
    )
