"""A tiny authoritative DNS server for tests inside a network namespace: A and TXT records from
a JSON zone, over UDP, nothing else (no recursion, so it never asks anyone).

    ip netns exec NS python tests/support/dns_responder.py --listen 198.51.100.2 --zone '{"a.test": {"A": ["1.2.3.4"]}}'

Prints "ready" once bound; answers until killed. Unknown names get NXDOMAIN."""

from __future__ import annotations

import argparse
import json
import socket

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset


def answer(query: dns.message.Message, zone: dict[str, dict[str, list[str]]]) -> dns.message.Message:
    response = dns.message.make_response(query)
    response.flags |= dns.flags.AA
    question = query.question[0]
    name = question.name.to_text().rstrip(".").lower()
    kind = dns.rdatatype.to_text(question.rdtype)
    records = zone.get(name)
    if records is None:
        response.set_rcode(dns.rcode.NXDOMAIN)
        return response
    values = records.get(kind, [])
    if values:
        if kind == "TXT":
            values = [f'"{v}"' for v in values]
        response.answer.append(dns.rrset.from_text_list(question.name, 60, "IN", kind, values))
    return response


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument("--zone", required=True, help="JSON: {name: {A: [...], TXT: [...]}}")
    args = parser.parse_args()
    zone = {name.lower(): records for name, records in json.loads(args.zone).items()}
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.listen, 53))
    print("ready", flush=True)
    while True:
        data, client = sock.recvfrom(4096)
        try:
            query = dns.message.from_wire(data)
            sock.sendto(answer(query, zone).to_wire(), client)
        except Exception:  # noqa: BLE001 - a malformed query gets no answer
            continue


if __name__ == "__main__":
    main()
