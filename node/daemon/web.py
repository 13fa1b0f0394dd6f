"""The node's HTTP port (--metrics-port): the live page at `/`, its JSON at `/api/status`
and Prometheus `/metrics`, served by a small trio handler in the daemon's nursery.

prometheus_client's own server runs in a bare background thread; this one lives in the
nursery like everything else. The page's files ship inside the package (page/), so nothing
is fetched from elsewhere: the page works on a machine without internet access.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib import resources

import trio

from sapo.node.daemon.prometheus import CONTENT_TYPE, NodeMetrics
from sapo.node.daemon.status import NodeStatus

log = logging.getLogger("sapo.web")

REQUEST_TIMEOUT_SECONDS = 5.0
MAX_REQUEST_BYTES = 8192

# path -> (file in page/, content type)
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/page.js": ("page.js", "text/javascript; charset=utf-8"),
    "/page.css": ("page.css", "text/css; charset=utf-8"),
}


def page_file(name: str) -> bytes:
    return (resources.files("sapo.node.daemon") / "page" / name).read_bytes()


class Routes:
    def __init__(self, metrics: NodeMetrics, status: Callable[[], NodeStatus]):
        self.metrics = metrics
        self.status = status
        self.static = {path: (page_file(name), kind) for path, (name, kind) in STATIC.items()}

    def answer(self, path: str) -> tuple[bytes, str, str]:
        """(body, status line, content type) for a GET of `path`."""
        if path in self.static:
            body, kind = self.static[path]
            return body, "200 OK", kind
        if path == "/api/status":
            return self.status().model_dump_json().encode(), "200 OK", "application/json"
        if path == "/metrics":
            self.metrics.observe_status(self.status())
            return self.metrics.render(), "200 OK", CONTENT_TYPE
        return (
            b"not found; try / (the page), /api/status (its JSON) or /metrics (Prometheus)\n",
            "404 Not Found",
            "text/plain",
        )


async def serve_page(
    metrics: NodeMetrics,
    status: Callable[[], NodeStatus],
    host: str,
    port: int,
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    routes = Routes(metrics, status)
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    log.info("page on http://%s:%d/, Prometheus metrics on /metrics", host, bound)
    task_status.started(bound)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(REQUEST_TIMEOUT_SECONDS):
                await _answer(stream, routes)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the browser went away mid-answer
        finally:
            await stream.aclose()

    await trio.serve_listeners(handle, listeners)


async def _answer(stream: trio.SocketStream, routes: Routes) -> None:
    request = b""
    while b"\r\n\r\n" not in request and len(request) < MAX_REQUEST_BYTES:
        chunk = await stream.receive_some(1024)
        if not chunk:
            return
        request += chunk
    parts = request.split(b" ", 2)
    path = parts[1].split(b"?")[0].decode(errors="replace") if len(parts) == 3 else ""
    try:
        body, status, kind = routes.answer(path)
    except Exception:  # noqa: BLE001 - a bug in a view must not take the node down
        log.exception("answering %s failed", path)
        body, status, kind = b"internal error; see the node's log\n", "500 Internal Server Error", "text/plain"
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    await stream.send_all(head.encode() + body)
