"""What bench/wild.py adds under libp2p in each of its processes: who a byte or a CPU second
belongs to, each node's own source address, and the link's latency.

Many node networks share one process, so a node is a value of the context variable `NODE`, set
in the task that runs it: trio copies a task's context into every task (and worker thread) it
spawns, py-libp2p's included, so each of them runs "as" that node.

- **CPU per node**: the event loop thread's CPU, shared out by sampling which node's task it is
  stepping (`CpuSampler`); worker threads (the intake's checks) are timed where they run
  (`charge_thread`). What no node's task ran (trio's own scheduling, I/O polling, garbage
  collection, the sampler) is the process's, reported beside and shared out evenly.
- **Bytes per node**: every byte libp2p writes to or reads from a TCP socket, without TCP/IP
  headers, charged to the node whose address the socket is bound to (its local address).
- **One address per node**: a namespace holds many nodes' addresses, and the kernel would dial
  out from its first one; each node's dials are bound to its own address, so the peers it dials
  see it in its own network group (IPv4 /16), as they would on the internet.
- **Latency**: this machine's kernel has no netem (CONFIG_NET_SCH_NETEM is not set), so the
  one-way delay is emulated here: bytes read from a socket become readable `delay` seconds after
  the kernel handed them over (a task per socket reads ahead, so the delay pipelines, as a
  link's does), and a dial waits one round trip before its TCP connect. Loss is the kernel's:
  nftables drops packets as they enter each namespace (bench/wild_net.py), and TCP recovers.
  What this does not emulate: TCP's own timers see the namespace's sub-millisecond round trip,
  so a lost segment is resent after about 200 ms (Linux's least RTO), not after ~300 ms.
"""

from __future__ import annotations

import contextvars
import signal
import threading
import time
from dataclasses import dataclass, field

import trio

# The node a task (or worker thread) works for; None: the process's own.
NODE: contextvars.ContextVar[NodeMeter | None] = contextvars.ContextVar("wild_node", default=None)
# Read-ahead per socket beyond which the reading task waits for the node to catch up.
READ_AHEAD_BYTES = 4 * 1024 * 1024


@dataclass(eq=False)  # one per node life, hashed by identity (the sampler counts by it)
class NodeMeter:
    """What one node life used: CPU on the event loop and in worker threads, bytes in and out."""

    ip: str
    loop_cpu_s: float = 0.0
    thread_cpu_s: float = 0.0
    build_cpu_s: float = 0.0  # making its own groups: a model's work, not the network's (subtracted)
    bytes_in: int = 0
    bytes_out: int = 0

    @property
    def cpu_s(self) -> float:
        return self.loop_cpu_s + self.thread_cpu_s - self.build_cpu_s

    def snapshot(self) -> dict:
        return {"cpu_s": round(self.cpu_s, 6), "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}


@dataclass
class Link:
    """The process's settings and its meters by address."""

    delay_s: float = 0.05
    meters: dict[str, NodeMeter] = field(default_factory=dict)  # local IP -> the node bound to it
    unowned_bytes: int = 0  # on sockets of no node's address: should stay 0
    unbound_dials: int = 0  # dials outside any node's context: should stay 0
    lock: threading.Lock = field(default_factory=threading.Lock)


LINK = Link()
_ORIGINALS: dict[str, object] = {}  # what install() replaced, for uninstall()


def meter_for(ip: str) -> NodeMeter:
    meter = LINK.meters[ip] = NodeMeter(ip)
    return meter


def charge_thread(meter: NodeMeter, seconds: float) -> None:
    with LINK.lock:
        meter.thread_cpu_s += seconds


def timed_in_thread(meter: NodeMeter, fn):
    """`fn`, its thread CPU charged to `meter` (for the work the exchange runs in worker threads)."""

    def timed(*args, **kwargs):
        started = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            charge_thread(meter, time.thread_time() - started)

    return timed


class CpuSampler:
    """Which node the event loop works for, sampled by the process's CPU profiling timer, and the
    loop thread's CPU shared out by the samples.

    (A trio instrument timing every task step cost more than the nodes themselves: a thread-CPU
    clock read is a syscall, and a process of 16 nodes steps tens of thousands of tasks a second.
    A sampling thread is no better: it gets the GIL where the loop lets go of it, in epoll and
    socket calls, not where the CPU goes.) SIGPROF comes every `interval` s of the process's CPU
    and its handler runs on the loop thread, between two bytecodes of whatever it was running:
    inside a task's step (trio's `unrolled_run` at its `task.context.run` line) the sample is that
    task's node; in epoll it is idle (a worker thread's CPU set the timer off); anywhere else it
    is trio's own work, the process's. Every `share_every` samples the loop thread's CPU since the
    last share is split over the busy samples, and a node's part goes to its meter."""

    def __init__(self, interval: float = 0.005, share_every: int = 50):
        from trio._core import _io_epoll, _run

        self.interval, self.share_every = interval, share_every
        self.run_code = _run.unrolled_run.__code__
        self.step_line = _step_line(_run.unrolled_run)
        self.idle_code = _io_epoll.EpollIOManager.get_events.__code__
        self.attributed = 0.0  # loop CPU given to nodes
        self.process = 0.0  # loop CPU in trio's own work
        self.samples = 0
        self.counts: dict[NodeMeter | None, int] = {}
        self.last = 0.0

    def start(self) -> None:
        """On the event loop's thread (the main thread: signal handlers run there)."""
        self.last = time.thread_time()
        signal.signal(signal.SIGPROF, self._tick)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)
        self._share()

    def _tick(self, signum, frame) -> None:
        self.samples += 1
        if frame is not None and frame.f_code is not self.idle_code:
            where = self._node_of(frame)
            self.counts[where] = self.counts.get(where, 0) + 1
        if self.samples % self.share_every == 0:
            self._share()

    def _node_of(self, frame) -> NodeMeter | None:
        """The node whose task the loop is stepping in `frame`'s stack; None: trio's own work."""
        while frame is not None and frame.f_code is not self.run_code:
            frame = frame.f_back
        if frame is None or frame.f_lineno != self.step_line:
            return None
        task = frame.f_locals.get("task")
        return None if task is None else task.context.get(NODE)

    def _share(self) -> None:
        now = time.thread_time()
        spent, self.last, counts, self.counts = now - self.last, now, self.counts, {}
        busy = sum(counts.values())
        if not busy:
            self.process += spent
            return
        for meter, count in counts.items():
            part = spent * count / busy
            if meter is None:
                self.process += part
            else:
                meter.loop_cpu_s += part
                self.attributed += part


def _step_line(unrolled_run) -> int:
    """The line of trio's run loop that steps a task (trio 0.35: `msg = task.context.run(...)`)."""
    import inspect

    lines, first = inspect.getsourcelines(unrolled_run)
    found = [first + i for i, line in enumerate(lines) if "task.context.run(" in line]
    if len(found) != 1:
        raise RuntimeError(f"trio's run loop changed: {len(found)} lines step a task; CpuSampler needs one")
    return found[0]


class _ReadAhead:
    """A socket's bytes with the time the kernel handed them over, read by a task of their own."""

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel(float("inf"))
        self.buffered = 0
        self.drained = trio.Event()
        self.leftover = b""
        self.final: bytes | BaseException | None = None  # EOF (b"") or the error that ended the socket
        self.scope = trio.CancelScope()


def install(delay_s: float) -> None:
    """Wrap py-libp2p's TCP stream and transport for this process (idempotent)."""
    from libp2p.io.trio import TrioTCPStream
    from libp2p.transport.tcp.tcp import TCP

    LINK.delay_s = delay_s
    if getattr(TrioTCPStream.read, "wild", False):
        return
    original_read, original_write, original_close = TrioTCPStream.read, TrioTCPStream.write, TrioTCPStream.close
    original_dial = TCP.dial
    _ORIGINALS.update(read=original_read, write=original_write, close=original_close, dial=original_dial)

    def owner(stream) -> NodeMeter | None:
        meter = stream.__dict__.get("_wild_meter", False)
        if meter is False:
            try:
                ip = stream.stream.socket.getsockname()[0]
            except OSError:
                ip = None
            meter = stream._wild_meter = LINK.meters.get(ip)
        return meter

    async def pump(stream, ahead: _ReadAhead) -> None:
        # A system task: nothing may escape it (it would end the whole run).
        with ahead.scope:
            try:
                while True:
                    while ahead.buffered > READ_AHEAD_BYTES:
                        ahead.drained = trio.Event()
                        await ahead.drained.wait()
                    data = await original_read(stream, 65536)
                    ahead.buffered += len(data)
                    ahead.send.send_nowait((trio.current_time(), data))
                    if not data:
                        return
            except BaseException as error:  # noqa: BLE001 - handed to the reader, raised there
                if isinstance(error, trio.Cancelled):
                    ahead.send.send_nowait((trio.current_time(), b""))
                    return
                ahead.send.send_nowait((trio.current_time(), error))

    async def read(self, n: int | None = None) -> bytes:
        ahead = self.__dict__.get("_wild_ahead")
        if ahead is None:
            ahead = self._wild_ahead = _ReadAhead()
            trio.lowlevel.spawn_system_task(pump, self, ahead, name="wild read-ahead")
        if ahead.leftover:
            data = ahead.leftover
        else:
            if ahead.final is not None:
                return _final(ahead.final)
            arrived, data = await ahead.receive.receive()
            await trio.sleep_until(arrived + LINK.delay_s)
            if isinstance(data, BaseException) or not data:
                ahead.final = data
                return _final(data)
            ahead.buffered -= len(data)
            ahead.drained.set()
        if n is not None and len(data) > n:
            data, ahead.leftover = data[:n], data[n:]
        else:
            ahead.leftover = b""
        _count(owner(self), len(data), "in")
        return data

    async def write(self, data: bytes) -> None:
        await original_write(self, data)
        _count(owner(self), len(data), "out")

    async def close(self) -> None:
        ahead = self.__dict__.get("_wild_ahead")
        if ahead is not None:
            ahead.scope.cancel()
        await original_close(self)

    async def dial(self, maddr):
        meter = NODE.get()
        if meter is None:
            LINK.unbound_dials += 1
            return await original_dial(self, maddr)
        await trio.sleep(2 * LINK.delay_s)  # SYN and SYN-ACK: one round trip before the connection is up
        return await self.dial_with_source(maddr, (meter.ip, 0))

    read.wild = True  # type: ignore[attr-defined]
    TrioTCPStream.read, TrioTCPStream.write, TrioTCPStream.close = read, write, close  # type: ignore[method-assign]
    TCP.dial = dial  # type: ignore[method-assign]


def uninstall() -> None:
    """py-libp2p's own TCP stream and transport again (for a test sharing its process)."""
    from libp2p.io.trio import TrioTCPStream
    from libp2p.transport.tcp.tcp import TCP

    if _ORIGINALS:
        TrioTCPStream.read, TrioTCPStream.write = _ORIGINALS["read"], _ORIGINALS["write"]  # type: ignore[method-assign]
        TrioTCPStream.close, TCP.dial = _ORIGINALS["close"], _ORIGINALS["dial"]  # type: ignore[method-assign]
        _ORIGINALS.clear()
    LINK.meters.clear()


def _final(value: bytes | BaseException) -> bytes:
    if isinstance(value, BaseException):
        raise value
    return value


def _count(meter: NodeMeter | None, size: int, way: str) -> None:
    if meter is None:
        LINK.unowned_bytes += size
    elif way == "in":
        meter.bytes_in += size
    else:
        meter.bytes_out += size
