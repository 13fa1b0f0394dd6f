"""The image's HEALTHCHECK: exit 0 if the container's sapo program answers, 1 (with the reason) if not.

- A node (`sapo-node start`) with --metrics-port: its page's GET /api/status answers with its
  peer id and a phase other than stopped. The page's address comes from DATA_DIR/status.json,
  which the node writes every few seconds, so any --metrics-port and --metrics-host work.
- A node without --metrics-port: status.json was rewritten in the last STALE_SECONDS.
- The judge (`sapo-node judge`): its libp2p port (--listen) accepts a TCP connection.

Standard library only: it runs every interval beside the node and must stay cheap.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from pathlib import Path

TIMEOUT_SECONDS = 5.0
STALE_SECONDS = 60.0
STATUS_FILE = "status.json"
DEFAULT_JUDGE_LISTEN = "/ip4/0.0.0.0/tcp/4101"


def sapo_command() -> list[str]:
    """The arguments after `sapo-node` of the container's sapo process (PID 1, or under an init)."""
    for proc in sorted(Path("/proc").glob("[0-9]*"), key=lambda p: int(p.name)):
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        for i, arg in enumerate(argv):
            if os.path.basename(arg) == "sapo-node":
                return [a for a in argv[i + 1 :] if a]
    raise SystemExit("unhealthy: no sapo-node process in this container")


def flag_value(args: list[str], name: str, default: str | None) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def check_node(args: list[str]) -> str:
    data_dir = Path(flag_value(args, "--data-dir", os.environ.get("SAPO_DATA_DIR", "sapo-data")))
    try:
        written = json.loads((data_dir / STATUS_FILE).read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"unhealthy: no readable {data_dir / STATUS_FILE} yet ({error})") from None
    if not written.get("page"):
        age = time.time() - float(written.get("updated", 0))
        if age > STALE_SECONDS:
            raise SystemExit(f"unhealthy: {data_dir / STATUS_FILE} is {age:.0f}s old")
        return f"node {written.get('peer_id')}: {written.get('phase')} (status.json {age:.0f}s old)"
    url = written["page"][0].rstrip("/") + "/api/status"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as answer:
            status = json.loads(answer.read())
    except (OSError, ValueError) as error:
        raise SystemExit(f"unhealthy: {url}: {error}") from None
    if not status.get("peer_id") or status.get("phase") == "stopped":
        raise SystemExit(f"unhealthy: {url} says phase {status.get('phase')!r}")
    return f"node {status['peer_id']}: {status['phase']}, round {status.get('round')}"


def check_judge(args: list[str]) -> str:
    listen = flag_value(args, "--listen", DEFAULT_JUDGE_LISTEN)
    parts = listen.split("/")  # ['', 'ip4', HOST, 'tcp', PORT]
    if len(parts) < 5 or parts[3] != "tcp":
        raise SystemExit(f"unhealthy: cannot read a TCP port from the judge's --listen {listen!r}")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(parts[2], parts[2])
    try:
        socket.create_connection((host, int(parts[4])), timeout=TIMEOUT_SECONDS).close()
    except OSError as error:
        raise SystemExit(f"unhealthy: judge port {host}:{parts[4]}: {error}") from None
    return f"judge accepts connections on {host}:{parts[4]}"


def main() -> None:
    args = sapo_command()
    command = args[0] if args else ""
    if command == "start":
        print(check_node(args))
    elif command == "judge":
        print(check_judge(args))
    else:
        print(f"sapo-node {command}: no health check for this command")


if __name__ == "__main__":
    main()
