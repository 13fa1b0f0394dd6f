"""A study's worker processes end with the study: on Linux the kernel sends the worker SIGTERM
when its parent dies, however the parent dies (a SIGKILLed study otherwise leaves its workers
training for the rest of the run).

Not for a swarm's nodes: trio starts them from a worker thread, and PDEATHSIG follows the
*thread* that forked, so a node would be sent SIGTERM as soon as that thread went back to its
pool. Nodes watch their swarm's pid instead (run.py, `--stop-with-parent`)."""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def end_with_parent(parent: int) -> None:
    """Run in the child (a process pool's initializer): SIGTERM when `parent` dies.
    A parent that died before this ran is noticed too (the child is reparented at once)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)
