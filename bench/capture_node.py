"""The honest process of bench/capture.py: the target node and the honest nodes, each a node life
of bench/wild_node.py (the daemon's `serve_network`, exchange, intake and rounds, unchanged),
with every fetch's draw logged.

The log wraps each node's `GroupFetcher._fetch_one`, the one call a pass makes per author it
draws, from outside: `serve_network` is wrapped so that the network it hands its caller has its
fetcher's method replaced on that instance. Nothing in protocol/ or node/ is changed. Each
entry: [seconds since the plan's t0 when the author was drawn, its peer id, seconds until the
fetcher was done with it].

    ip netns exec NS python -m bench.capture_node PLAN.json PROCESS
"""

from __future__ import annotations

import sys
import time
from typing import Any

import trio

from bench import wild_node

DRAWS: dict[str, list[list]] = {}  # a node's peer id -> the authors its fetcher drew


def log_draws(net: Any, t0: float) -> None:
    fetcher = net.fetcher
    drawn = DRAWS.setdefault(net.peer_id, [])
    fetch_one = fetcher._fetch_one

    async def logged(author: Any, max_groups: int) -> None:
        started = time.time()
        try:
            await fetch_one(author, max_groups)
        finally:
            drawn.append([round(started - t0, 3), author.peer_id.to_base58(), round(time.time() - started, 3)])

    fetcher._fetch_one = logged


def instrument(plan: dict) -> None:
    """Make `sapo.protocol.network.serve_network` (which wild_node imports when a node starts)
    log its fetcher's draws."""
    import sapo.protocol.network as network

    serve_network = network.serve_network

    async def serve_logged(*args: Any, task_status: Any = trio.TASK_STATUS_IGNORED, **kwargs: Any) -> None:
        class Started:
            def started(self, net: Any = None) -> None:
                log_draws(net, plan["t0"])
                task_status.started(net)

        await serve_network(*args, task_status=Started(), **kwargs)

    network.serve_network = serve_logged  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    plan, process = wild_node.load(argv)
    instrument(plan)
    rows = trio.run(wild_node.run_process, plan, process)
    for row in rows:
        if row["kind"] == "node":
            row["draws"] = DRAWS.get(row["peer_id"], [])
    wild_node.write_rows(plan, process, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
