"""The addresses peers can really dial, for the `listening on` lines.

A node listening on 0.0.0.0 (the default) is reachable on every interface's address, but
0.0.0.0 itself is not an address anyone can dial. Each wildcard listen address becomes one
address per interface: the machine's network addresses first (what a peer elsewhere dials),
loopback last (peers on this machine).
"""

from __future__ import annotations

import ipaddress
import socket

import psutil

WILDCARDS = {"ip4": "0.0.0.0", "ip6": "::"}
FAMILIES = {"ip4": socket.AF_INET, "ip6": socket.AF_INET6}


def interface_addresses(family: int) -> list[tuple[str, str]]:
    """(interface, address) of every usable address of one family, loopback last.
    IPv6 link-local addresses are left out: they need a zone a multiaddr cannot carry."""
    found = []
    for interface, addresses in psutil.net_if_addrs().items():
        for address in addresses:
            if address.family != family:
                continue
            ip = ipaddress.ip_address(address.address.split("%")[0])
            if ip.is_link_local:
                continue
            found.append((interface, str(ip)))
    return sorted(found, key=lambda item: (ipaddress.ip_address(item[1]).is_loopback, item[0], item[1]))


def dialable(address: str) -> list[str]:
    """`address` (e.g. /ip4/0.0.0.0/tcp/4001/p2p/ID) with a wildcard host replaced by each
    interface's address; any other address unchanged."""
    parts = address.split("/")  # ['', 'ip4', '0.0.0.0', 'tcp', '4001', 'p2p', ID]
    if len(parts) < 3 or WILDCARDS.get(parts[1]) != parts[2]:
        return [address]
    expanded = ["/".join([*parts[:2], ip, *parts[3:]]) for _, ip in interface_addresses(FAMILIES[parts[1]])]
    return expanded or [address]


def dialable_all(addresses: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for address in addresses:
        for one in dialable(address):
            seen.setdefault(one, None)
    return list(seen)


def page_urls(host: str, port: int) -> list[str]:
    """Where a browser on this machine, or one elsewhere, opens the page."""
    if host in ("0.0.0.0", "::", ""):
        family = socket.AF_INET6 if host == "::" else socket.AF_INET
        hosts = [ip for _, ip in interface_addresses(family)]
        hosts = sorted(hosts, key=lambda ip: not ipaddress.ip_address(ip).is_loopback)  # loopback first here
    else:
        hosts = [host]
    return [f"http://[{h}]:{port}/" if ":" in h else f"http://{h}:{port}/" for h in hosts] or [f"http://{host}:{port}/"]
