"""The network namespaces of bench/wild.py: one per process, all joined by veth pairs to a bridge
that lives in a namespace of its own; no address is ever added to the root namespace.

Each process namespace holds the addresses of the nodes that process hosts, in several IPv4
/16s (11.81-11.84.x.x and up), all on one /8 so that every address reaches every other over the
bridge. They are public addresses, as a public swarm's nodes have, because the node puts every
private address (10.x included) in one "local" network group: with 10.x addresses no cap by
network group would act (the first runs used 10.81-10.84 and were, to the nodes, one group).
They exist only inside the namespaces this bench makes; nothing is routed outside them. Loss is the kernel's: an nftables rule drops
a share of the packets entering each process namespace, from the bridge or from a node beside
it alike, so each packet crosses the rule once. (Latency is emulated in the processes,
bench/wild_link.py: this kernel has no netem.)

Every namespace's name starts with the run's prefix, and `remove` deletes them by it; `PREFIX`
alone (`--cleanup`) removes what any run left behind.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

PREFIX = "swild"
FIRST_GROUP = 81  # 11.81.x.x
INTERFACE = "ve0"


@dataclass(frozen=True)
class Namespaces:
    prefix: str
    processes: list[str]  # one namespace per process, in process order

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    def all(self) -> list[str]:
        return [self.bridge, *self.processes]


def address(group: int, process: int, index: int) -> str:
    """The `index`-th address of network group `group` (a /16) in process `process`."""
    if not 0 <= index < 254 or not 0 <= process < 255:
        raise ValueError(f"address {index} of process {process}: at most 254 a group and 255 processes")
    return f"11.{FIRST_GROUP + group}.{process}.{index + 1}"


def network_group(ip: str) -> str:
    return ".".join(ip.split(".")[:2])


def available() -> str | None:
    """Why namespaces cannot be made here, or None."""
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (iproute2, nftables)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"`ip netns` refused: {probe.stderr.strip()}"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def build(prefix: str, addresses: list[list[str]], loss_percent: float) -> Namespaces:
    """A bridge namespace and one namespace per entry of `addresses` (a process's nodes' addresses),
    each with one veth to the bridge carrying those addresses and dropping `loss_percent` of what
    enters it. On any failure what was made is removed before raising."""
    spaces = Namespaces(prefix, [f"{prefix}-p{k}" for k in range(len(addresses))])
    try:
        ip("netns", "add", spaces.bridge)
        ip("-n", spaces.bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", spaces.bridge, "link", "set", "br0", "up")
        for k, (space, own) in enumerate(zip(spaces.processes, addresses)):
            ip("netns", "add", space)
            ip("-n", space, "link", "set", "lo", "up")
            ip("-n", spaces.bridge, "link", "add", f"vb{k}", "type", "veth", "peer", "name", INTERFACE)
            ip("-n", spaces.bridge, "link", "set", INTERFACE, "netns", space)
            ip("-n", spaces.bridge, "link", "set", f"vb{k}", "master", "br0")
            ip("-n", spaces.bridge, "link", "set", f"vb{k}", "up")
            for a in own:
                ip("-n", space, "addr", "add", f"{a}/8", "dev", INTERFACE)
            ip("-n", space, "link", "set", INTERFACE, "up")
            if loss_percent > 0:
                drop_entering(space, loss_percent)
    except BaseException:
        remove(prefix)
        raise
    return spaces


def drop_entering(space: str, loss_percent: float) -> None:
    """Drop `loss_percent` % of the packets that enter `space` (its own to itself included)."""
    per_10k = round(loss_percent * 100)
    rules = (
        "table ip wild {\n"
        "  chain entering {\n"
        "    type filter hook input priority 0; policy accept;\n"
        "    counter\n"
        f"    numgen random mod 10000 < {per_10k} counter drop\n"
        "  }\n"
        "}\n"
    )
    subprocess.run(["ip", "netns", "exec", space, "nft", "-f", "-"], input=rules, text=True, check=True, timeout=20)


def loss_counts(space: str) -> tuple[int, int]:
    """(packets that entered `space`, packets the loss rule dropped of them); (0, 0) without the rule."""
    listing = subprocess.run(
        ["ip", "netns", "exec", space, "nft", "list", "chain", "ip", "wild", "entering"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    counts = [int(n) for n in re.findall(r"counter packets (\d+)", listing.stdout)]
    return (counts[0], counts[1]) if listing.returncode == 0 and len(counts) == 2 else (0, 0)


def remove(prefix: str) -> list[str]:
    """Delete every namespace whose name starts with `prefix`; the names deleted."""
    listed = ip("netns", "list", check=False).stdout.split("\n")
    names = [line.split()[0] for line in listed if line.strip() and line.split()[0].startswith(prefix)]
    for name in sorted(names, reverse=True):
        ip("netns", "del", name, check=False)
    return names
