"""Bootstrap peers given by name: /dns4 from a hosts file, /dnsaddr from TXT records.

Namespaces on one bridge (bench/nat_topology.py, no NAT needed). `ip netns exec` mounts
/etc/netns/<ns>/hosts and resolv.conf over /etc's, so each test names its own hosts; every
resolv.conf points at a DNS server inside the test's namespaces (or at nothing), so no query
leaves them. The first test runs a real `sapo-node start` (the CLI, the daemon, the tiny model).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.gossip_peer import PeerProcess, write_groups
from bench.nat_topology import NatTopology, missing
from tests.support.processes import PLUMBING, NodeProcess

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"DNS namespaces: {missing()}")

NODE_SWARM = "default"  # a node's swarm name, hence its topic
# What node/judge/client.py does with its --judge address: a host of ours, host.connect(/dns4/...).
JUDGE_PROBE = """
import sys, trio, multiaddr
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr
from sapo.protocol.toolkit.hosts import new_noise_host
async def main():
    listen = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
    host = new_noise_host(create_new_key_pair(), [listen])
    async with host.run([listen]):
        with trio.fail_after(30):
            await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(sys.argv[1])))
        print("connected")
        await host.close()
trio.run(main)
"""


def wait_for(condition, timeout: float, what: str, processes) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        dead = [p for p in processes if not p.alive()]
        assert not dead, f"a process exited while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.5)


def test_a_node_bootstraps_from_a_dns4_name_in_its_hosts_file(tmp_path, nodes):
    with NatTopology(f"dn{os.getpid() % 10000}", public=2, nated=0) as topo:
        boot_ns, node_ns = topo.public_ns
        topo.write_etc(node_ns, "hosts", f"127.0.0.1 localhost\n{topo.public_ip[0]} bootstrap.sapo.test\n")
        topo.write_etc(node_ns, "resolv.conf", "nameserver 127.0.0.1\n")  # no DNS server: the hosts file or nothing
        boot = PeerProcess(
            "bootstrap",
            tmp_path / "bootstrap",
            prefix=topo.prefix(boot_ns),
            rate=0,
            fetch=4,  # asks for groups, as a node does: the node's own reach it only that way
            settings={"swarm": NODE_SWARM},
            groups_file=write_groups(tmp_path / "groups.json"),
        )
        try:
            boot_id = boot.wait_up(90)
            name = f"/dns4/bootstrap.sapo.test/tcp/4001/p2p/{boot_id}"
            # py-libp2p's own resolver (its TCP transport and BootstrapDiscovery use it) asks DNS
            # servers only, so it gives the name back unresolved: why addresses.py uses getaddrinfo.
            probe = subprocess.run(
                [
                    *topo.prefix(node_ns),
                    sys.executable,
                    "-c",
                    "import trio; from multiaddr import Multiaddr; from multiaddr.resolvers import DNSResolver; "
                    "print(trio.run(DNSResolver().resolve, Multiaddr('/dns4/bootstrap.sapo.test/tcp/4001')))",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert "/ip4/" not in probe.stdout, probe.stdout
            nodes.append(
                NodeProcess(
                    tmp_path / "node",
                    [*PLUMBING, "--peers", name],
                    prefix=topo.prefix(node_ns),
                    listen=f"/ip4/{topo.public_ip[1]}/tcp/4001",
                    start_timeout=120,
                )
            )
            node = nodes[-1]
            wait_for(
                lambda: any(e["sender"] == node.peer_id for e in boot.of("recv")),
                180,
                "the node's first rollout group at the bootstrap",
                [boot],
            )
            assert node.alive()
        finally:
            boot.stop()
    assert "connected to bootstrap peer" in node.log_text()


def test_a_dnsaddr_names_several_bootstrap_peers_and_a_late_name_is_retried(tmp_path):
    with NatTopology(f"da{os.getpid() % 10000}", public=5, nated=0) as topo:
        dns_ns, client_ns, *boot_ns = topo.public_ns
        groups = write_groups(tmp_path / "groups.json")
        boots = [
            PeerProcess(f"boot{i}", tmp_path / f"boot{i}", prefix=topo.prefix(ns), rate=0, groups_file=groups)
            for i, ns in enumerate(boot_ns)
        ]
        started = list(boots)
        responder = None
        try:
            ids = [b.wait_up(90) for b in boots]
            ips = topo.public_ip[2:]
            zone = {
                # two of the three bootstrap peers, one by IP and one by a name that has an A record
                "_dnsaddr.swarm.sapo.test": {
                    "TXT": [
                        f"dnsaddr=/ip4/{ips[0]}/tcp/4001/p2p/{ids[0]}",
                        f"dnsaddr=/dns4/boot1.sapo.test/tcp/4001/p2p/{ids[1]}",
                    ]
                },
                "boot1.sapo.test": {"A": [ips[1]]},
            }
            responder = subprocess.Popen(
                [
                    *topo.prefix(dns_ns),
                    sys.executable,
                    str(ROOT / "tests" / "support" / "dns_responder.py"),
                    "--listen",
                    topo.public_ip[0],
                    "--zone",
                    json.dumps(zone),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert responder.stdout.readline().strip() == "ready"
            topo.write_etc(client_ns, "resolv.conf", f"nameserver {topo.public_ip[0]}\n")
            hosts = Path("/etc/netns") / client_ns / "hosts"
            topo.write_etc(client_ns, "hosts", "127.0.0.1 localhost\n")  # boot2's name is not there yet
            client = PeerProcess(
                "client",
                tmp_path / "client",
                prefix=topo.prefix(client_ns),
                rate=0,
                groups_file=groups,
                peers=["/dnsaddr/swarm.sapo.test", f"/dns4/late.sapo.test/tcp/4001/p2p/{ids[2]}"],
                settings={"discover_peers": 0},
            )
            started.append(client)
            client.wait_up(90)

            def connected() -> set[str]:
                return set((client.last_state() or {}).get("conns", {}))

            wait_for(lambda: set(ids[:2]) <= connected(), 60, "both peers the TXT records name", started)
            wait_for(
                lambda: (client.last_state() or {}).get("counters", {}).get("dns_failed", 0) >= 1,
                30,
                "the late name to fail at least once",
                started,
            )
            assert ids[2] not in connected()
            hosts.write_text(f"127.0.0.1 localhost\n{ips[2]} late.sapo.test\n")  # same file, same mount
            wait_for(lambda: set(ids) <= connected(), 60, "the late name to resolve and connect", started)
            # The judge client dials its /dns4 address through py-libp2p's own TCP transport, whose
            # resolver asks the DNS server: that is how the compose judge is reached.
            probe = subprocess.run(
                [
                    *topo.prefix(client_ns),
                    sys.executable,
                    "-c",
                    JUDGE_PROBE,
                    f"/dns4/boot1.sapo.test/tcp/4001/p2p/{ids[1]}",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert probe.stdout.strip().endswith("connected"), probe.stdout + probe.stderr[-2000:]
        finally:
            if responder is not None:
                responder.kill()
                responder.wait()
            for p in started:
                p.stop()
