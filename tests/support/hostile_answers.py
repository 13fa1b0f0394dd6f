"""Answers an attacker sends to make a scorer run code, and a witness that sees if one did.

`code_execution_answers(marker)` gives the issue's binary_matrix answer and 100 other strings, each
of which, if any scorer evaluated or executed it, would create the file `marker`, start a process,
open a socket or load a module. `SideEffects` is a second audit hook, independent of the node's
own guard (training/problems/untrusted.py), that records every such event on the scoring thread.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

# Each would create the marker, or reach the OS, if it were ever run as Python.
_CODE = [
    "__import__('os').system('touch {m}')",
    "__import__('subprocess').call(['touch', '{m}'])",
    "__import__('subprocess').Popen('touch {m}', shell=True)",
    "open('{m}', 'w').write('x')",
    "exec(\"open('{m}', 'w').write('x')\")",
    "eval(\"__import__('os').system('touch {m}')\")",
    "(lambda: __import__('os').system('touch {m}'))()",
    "__builtins__.__import__('os').system('touch {m}')",
    "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0]('touch {m}', shell=True)",
    "__import__('socket').create_connection(('127.0.0.1', 9))",
    "__import__('pathlib').Path('{m}').touch()",
    "compile(\"open('{m}', 'w')\", 'x', 'exec')",
    "f\"{{__import__('os').system('touch {m}')}}\"",
    "__import__('os').popen('touch {m}').read()",
    "__import__('os').spawnv(__import__('os').P_WAIT, '/usr/bin/touch', ['touch', '{m}'])",
    "__import__('shutil').copy('/etc/hostname', '{m}')",
    "__import__('ctypes').CDLL(None).system(b'touch {m}')",
    "__import__('pickle').loads(b\"cos\\nsystem\\n(S'touch {m}'\\ntR.\")",
    "__import__('importlib').import_module('os').system('touch {m}')",
    "getattr(__import__('os'), 'sys' + 'tem')('touch {m}')",
    "__import__('os').write(__import__('os').open('{m}', 65), b'x')",
    "__\uff49\uff4d\uff50\uff4f\uff52\uff54__('os').system('touch {m}')",  # fullwidth: NFKC makes it __import__
    "$(touch {m})",
    "`touch {m}`",
    "; touch {m} #",
]
# How each is placed: alone, as a binary matrix of lists, behind a comment, after a matrix row.
_WRAPPERS = ["{c}", "[[{c}]]", "{c} # 1 0", "1 0\n{c}"]

ISSUE_BINARY_MATRIX = "__import__('os').system('touch {m}')"


def code_execution_answers(marker: str) -> list[str]:
    """The issue's binary_matrix answer, then 100 others; each names `marker` as its target."""
    others = [wrapper.format(c=code) for code in _CODE for wrapper in _WRAPPERS]
    assert len(others) == 100
    return [ISSUE_BINARY_MATRIX.format(m=marker)] + [text.replace("{m}", marker) for text in others]


# What no scorer may cause: running code, reaching the OS, loading a module.
WATCHED_PREFIXES = ("os.", "subprocess.", "socket.", "shutil.", "ctypes.", "pty.")
WATCHED = {"exec", "compile", "import", "open", "marshal.loads", "pickle.find_class", "code.__new__"}


class SideEffects:
    """Records the watched audit events raised on the thread that is inside `watching()`."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self._local = threading.local()
        sys.addaudithook(self._hook)  # once per SideEffects; a hook cannot be removed

    def _hook(self, event: str, args: tuple) -> None:
        if getattr(self._local, "on", False) and (event in WATCHED or event.startswith(WATCHED_PREFIXES)):
            self.events.append((event, repr(args)[:100]))

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        self._local.on = True
        try:
            yield
        finally:
            self._local.on = False


_WITNESS: SideEffects | None = None


def witness() -> SideEffects:
    """The process's one witness (a fresh list of events each call)."""
    global _WITNESS
    if _WITNESS is None:
        _WITNESS = SideEffects()
    _WITNESS.events = []
    return _WITNESS
