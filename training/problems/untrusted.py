"""While a stranger's text is being scored, the scoring thread may not run code, start a process,
open a socket or a file, or load a module: defence in depth under the strict answer grammars.

The grammars (training/problems/task_scorers.py) already keep every stranger's answer away from
reasoning-gym's scorers, several of which call `eval` on their argument. This guard is for the
mistake nobody has made yet: a future scorer, a library upgrade, a new task. It is a PEP 578
audit hook (`sys.addaudithook`), installed once per process and acting only on a thread inside
`untrusted_text()`: there it refuses the events below by raising `UntrustedCodeRefused`, so the
offending call fails closed (the answer scores 0) and is counted and logged, instead of running.

Audit hooks are not a sandbox against code that is already running (CPython's own docs say so:
native code can skip them): they stop the first step, turning a string into code or a call into
the OS, which is where every attack on a scorer starts.
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import gc
import logging
import sys
import threading
from collections.abc import Callable, Iterator

log = logging.getLogger("sapo.untrusted")

# Turning text into code, and running it.
_CODE = {"compile", "exec", "code.__new__", "function.__new__", "marshal.loads", "pickle.find_class", "import"}
# The OS: processes, files, sockets, libraries, and the interpreter's own guards.
_SYSTEM = {"open", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "sys.addaudithook", "sys.settrace"}
_SYSTEM_PREFIXES: tuple[str, ...] = (
    *("os.", "subprocess.", "socket.", "shutil.", "pty.", "ctypes.", "sqlite3.", "urllib.", "http."),
    *("ftplib.", "smtplib.", "webbrowser.", "tempfile.", "glob.", "fcntl.", "resource.", "signal."),
)
# Changing types and frames from inside: the usual way out of a restricted namespace.
_INTROSPECTION = {"object.__setattr__", "object.__delattr__", "object.__getattr__", "sys._getframe"}
_INTROSPECTION |= {"sys._current_frames", "sys.setprofile", "gc.get_objects", "gc.get_referrers", "gc.get_referents"}
REFUSED_EVENTS = frozenset(_CODE | _SYSTEM | _INTROSPECTION)

# The last refusals, for the log and for tests: (event, a short rendering of its arguments).
RECENT_REFUSALS = 32


class UntrustedCodeRefused(PermissionError):
    """An audit event a scorer must never cause happened while a stranger's text was scored."""


class _Guard(threading.local):
    active = False


_guard = _Guard()
_install_lock = threading.Lock()
_installed = False
refused_count = 0
recent_refusals: collections.deque[tuple[str, str]] = collections.deque(maxlen=RECENT_REFUSALS)


def is_refused(event: str) -> bool:
    return event in REFUSED_EVENTS or event.startswith(_SYSTEM_PREFIXES)


def _hook(event: str, args: tuple, _guard: _Guard = _guard) -> None:  # bound now: globals go at exit
    if _guard.active and is_refused(event):
        _refuse(event, args)


def _refuse(event: str, args: tuple) -> None:
    global refused_count
    _guard.active = False  # rendering the arguments must not recurse into the hook
    try:
        refused_count += 1
        recent_refusals.append((event, repr(args)[:120]))
    finally:
        _guard.active = True
    raise UntrustedCodeRefused(f"audit event {event!r} refused while scoring a stranger's text")


def _guarded_thread_start(start: Callable[..., int]) -> Callable[..., int]:
    """Python 3.11 raises no audit event when a thread starts, and the guard is per thread: a
    thread started under it would run free. So starting one is refused here, as an event."""

    def start_new_thread(function: Callable[..., object], args: tuple, *kwargs: dict) -> int:
        if _guard.active:
            _refuse("_thread.start_new_thread", (function,))
        return start(function, args, *kwargs)

    return start_new_thread


def install() -> None:
    """Install the audit hook (once per process; it cannot be removed, and costs one attribute
    read per audit event on threads outside `untrusted_text`)."""
    global _installed
    with _install_lock:
        if not _installed:
            sys.addaudithook(_hook)
            threading._start_new_thread = _guarded_thread_start(threading._start_new_thread)  # type: ignore[attr-defined]
            _thread.start_new_thread = _guarded_thread_start(_thread.start_new_thread)
            _installed = True


# Threads inside a block, and whether the collector was on when the first of them entered.
_collector_lock = threading.Lock()
_inside = 0
_collector_was_enabled = False


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """The cyclic collector off while any thread is inside a block: a collection runs other code's
    finalizers and gc callbacks on whichever thread allocates, which must not run under the guard
    (they are not the scorer's code, and would fail or be charged to a stranger)."""
    global _inside, _collector_was_enabled
    with _collector_lock:
        if _inside == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _inside += 1
    try:
        yield
    finally:
        with _collector_lock:
            _inside -= 1
            if _inside == 0 and _collector_was_enabled:
                gc.enable()


@contextlib.contextmanager
def untrusted_text() -> Iterator[None]:
    """Within this block, this thread causes no refused audit event: each one raises instead."""
    install()
    before = refused_count
    outer = _guard.active
    try:
        with _no_collection():
            _guard.active = True
            yield
    finally:
        _guard.active = outer
        if refused_count != before and not outer:
            for event, args in list(recent_refusals)[-(refused_count - before) :]:
                log.warning("refused %s while scoring a stranger's text: %s", event, args)
