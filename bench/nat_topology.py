"""Network namespaces for NAT tests and benchmarks: an "internet" and home routers, on one machine.

    public hosts   <tag>-p<j>  198.51.100.<2+j>/24      (each its own namespace)
    "internet"     <tag>-wan   a bridge, 198.51.100.1/24 (TEST-NET-2: never routed anywhere)
    routers        <tag>-r<i>  wan0 198.51.100.<100+i>, lan0 10.66.<i>.1/24
    NATed hosts    <tag>-h<i>  eth0 10.66.<i>.2/24, default route via its router

Each router does what a home router does: source NAT (nftables masquerade) for its LAN,
forwards replies to connections its LAN opened, and silently drops everything else that
arrives on its WAN side (no port forwarding). Linux masquerade keeps the source port when it
can, so these are "cone" NATs that hole punching gets through. `symmetric` routers pick a
random port for every connection (masquerade random), so a peer's address as seen by one host
says nothing about the one the next host will see: hole punching cannot work there, and
those hosts stay reachable only through a relay.

Nothing here touches the root namespace: every address lives inside namespaces created here,
and `close()` (or leaving the `with`) deletes them all, with any /etc/netns/<ns> files written.
Needs root, iproute2 and nftables (`nft`); `missing()` says what is absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

WAN_PREFIX = "198.51.100"
LAN_PREFIX = "10.66"

_ROUTER_RULES = """
table ip nat {{
  chain postrouting {{
    type nat hook postrouting priority 100;
    oifname "wan0" masquerade{random}
  }}
}}
table ip filter {{
  chain input {{
    type filter hook input priority 0; policy accept;
    iifname "wan0" ct state established,related accept
    iifname "wan0" drop
  }}
  chain forward {{
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    iifname "lan0" oifname "wan0" accept
  }}
}}
"""


def missing() -> str | None:
    """Why this machine cannot build the topology, or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if shutil.which("nft") is None:
        return "nftables' `nft` is not installed (apt-get install nftables)"
    return None


def run(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=30, input=stdin)


class NatTopology:
    """`public` hosts on the internet bridge and `nated` hosts behind their own router each."""

    def __init__(self, tag: str, *, public: int = 1, nated: int = 2, symmetric: frozenset[int] = frozenset()):
        if not 1 <= public <= 90 or not 0 <= nated <= 150:
            raise ValueError("between 1 and 90 public hosts and at most 150 NATed ones")
        self.tag = tag
        self.wan = f"{tag}-wan"
        self.public_ns = [f"{tag}-p{j}" for j in range(public)]
        self.public_ip = [f"{WAN_PREFIX}.{2 + j}" for j in range(public)]
        self.router_ns = [f"{tag}-r{i}" for i in range(nated)]
        self.router_ip = [f"{WAN_PREFIX}.{100 + i}" for i in range(nated)]
        self.nated_ns = [f"{tag}-h{i}" for i in range(nated)]
        self.nated_ip = [f"{LAN_PREFIX}.{i}.2" for i in range(nated)]
        self.symmetric = symmetric
        self._created: list[str] = []

    def __enter__(self) -> NatTopology:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add(self, ns: str) -> None:
        run("ip", "netns", "add", ns)
        self._created.append(ns)
        run("ip", "-n", ns, "link", "set", "lo", "up")

    def _build(self) -> None:
        self._add(self.wan)
        run("ip", "-n", self.wan, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.wan, "addr", "add", f"{WAN_PREFIX}.1/24", "dev", "br0")
        run("ip", "-n", self.wan, "link", "set", "br0", "up")
        for j, (ns, ip) in enumerate(zip(self.public_ns, self.public_ip)):
            self._add(ns)
            self._plug_into_wan(ns, f"p{j}", "eth0", ip)
        for i, (router, host) in enumerate(zip(self.router_ns, self.nated_ns)):
            self._add(router)
            self._plug_into_wan(router, f"r{i}", "wan0", self.router_ip[i])
            self._add(host)
            # the LAN: a veth pair from the router to its one host
            run("ip", "-n", router, "link", "add", "lan0", "type", "veth", "peer", "name", "eth0")
            run("ip", "-n", router, "link", "set", "eth0", "netns", host)
            run("ip", "-n", router, "addr", "add", f"{LAN_PREFIX}.{i}.1/24", "dev", "lan0")
            run("ip", "-n", router, "link", "set", "lan0", "up")
            run("ip", "-n", host, "addr", "add", f"{self.nated_ip[i]}/24", "dev", "eth0")
            run("ip", "-n", host, "link", "set", "eth0", "up")
            run("ip", "-n", host, "route", "add", "default", "via", f"{LAN_PREFIX}.{i}.1")
            run("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            rules = _ROUTER_RULES.format(random=" random" if i in self.symmetric else "")
            run("ip", "netns", "exec", router, "nft", "-f", "-", stdin=rules)

    def _plug_into_wan(self, ns: str, bridge_end: str, inside: str, ip: str) -> None:
        run("ip", "-n", self.wan, "link", "add", bridge_end, "type", "veth", "peer", "name", inside)
        run("ip", "-n", self.wan, "link", "set", inside, "netns", ns)
        run("ip", "-n", self.wan, "link", "set", bridge_end, "master", "br0")
        run("ip", "-n", self.wan, "link", "set", bridge_end, "up")
        run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", inside)
        run("ip", "-n", ns, "link", "set", inside, "up")

    @staticmethod
    def prefix(ns: str) -> list[str]:
        """Run a command inside `ns`."""
        return ["ip", "netns", "exec", ns]

    def write_etc(self, ns: str, name: str, text: str) -> None:
        """/etc/netns/<ns>/<name> (hosts, resolv.conf): `ip netns exec` mounts it over /etc/<name>."""
        folder = Path("/etc/netns") / ns
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)

    def close(self) -> None:
        for ns in reversed(self._created):
            run("ip", "netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        self._created.clear()
