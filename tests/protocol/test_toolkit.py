"""Each part is written once (STYLE.md, "The same part, written four times"): the package (node/,
protocol/, sampling/, training/) has one bounded map (training/bounded.py), one token bucket
(protocol/toolkit/buckets.py), one loop that reads a frame off a stream (protocol/toolkit/frames.py) and one
server and asker of requests (protocol/toolkit/streams.py). These tests fail on a second copy, found by
reading the source with `ast`, so that a fix (a bound, a deadline, a limit) lands everywhere
at once. The parts' own tests: tests/training/test_bounded.py, tests/protocol/test_buckets.py,
tests/protocol/test_streams.py."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("node", "protocol", "sampling", "training")
BOUNDED_MAP = "training/bounded.py"
BUCKETS = "protocol/toolkit/buckets.py"
FRAMES = "protocol/toolkit/frames.py"
# Who may read a frame off a stream: the request-response server and asker, and the judge's
# four-frame dialogue (one stream, several frames, its own refusal reasons).
FRAME_READERS = {"protocol/toolkit/streams.py", "protocol/wire/judge_wire.py", FRAMES}


def sources() -> Iterator[tuple[str, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))


def names_in(node: ast.AST) -> set[str]:
    """Every name and attribute name under `node`."""
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
    return found


def about_tokens(node: ast.AST) -> bool:
    return any("token" in name.lower() for name in names_in(node))


def is_time_rate(node: ast.AST) -> bool:
    """A product or quotient of a time difference (`now - then`, `elapsed`): refill arithmetic."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Div)):
        return False
    subtracts = any(isinstance(c, ast.BinOp) and isinstance(c.op, ast.Sub) for c in ast.walk(node))
    return subtracts or "elapsed" in names_in(node)


def popitems(tree: ast.Module) -> list[int]:
    """Lines of `.popitem(last=False)`: evicting the oldest of an OrderedDict by hand."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "popitem"
        and any(k.arg == "last" and isinstance(k.value, ast.Constant) and k.value.value is False for k in node.keywords)
    ]


def refills(tree: ast.Module) -> list[int]:
    """Lines of `min(cap, tokens + <time> * <rate>)`: a token bucket's refill."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "min"
        and any(
            isinstance(arg, ast.BinOp)
            and isinstance(arg.op, ast.Add)
            and about_tokens(arg.left)
            and (is_time_rate(arg.right) or is_time_rate(arg.left))
            for arg in node.args
        )
    ]


def spends(tree: ast.Module) -> list[int]:
    """Lines that spend or owe a bucket's tokens by hand: `tokens -= cost`, `tokens - 1.0`,
    `cost - tokens` (a shortfall), `-tokens / rate` (a debt's wait). Not in training/, whose
    tokens are a model's (a rate of them, `new_tokens / seconds`, is not a bucket either)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add | ast.Sub) and about_tokens(node.target):
            found.append(node.lineno)
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Sub)
            and any(
                isinstance(side, ast.Name | ast.Attribute) and about_tokens(side) for side in (node.left, node.right)
            )
        ):
            found.append(node.lineno)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and about_tokens(node.operand):
            found.append(node.lineno)
    return found


def stream_read_loops(tree: ast.Module) -> list[int]:
    """Lines of loops that await `something.read(...)`: reading frames off a stream by hand."""
    return [
        loop.lineno
        for loop in ast.walk(tree)
        if isinstance(loop, ast.While | ast.For | ast.AsyncFor)
        and any(
            isinstance(node, ast.Await)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "read"
            for node in ast.walk(loop)
        )
    ]


def frame_reads(tree: ast.Module) -> list[int]:
    """Lines that call `read_frame(...)`: reading a request or an answer off a stream."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == "read_frame")
            or (isinstance(node.func, ast.Attribute) and node.func.attr == "read_frame")
        )
    ]


def copies(find, allowed: set[str], packages: tuple[str, ...] = PACKAGES) -> list[str]:
    return [
        f"{path}:{line}"
        for path, tree in sources()
        if path not in allowed and path.split("/")[0] in packages
        for line in find(tree)
    ]


def test_one_bounded_map():
    assert copies(popitems, {BOUNDED_MAP}) == [], "evict through training/bounded.py's BoundedMap"


def test_one_token_bucket():
    assert copies(refills, {BUCKETS}) == [], "refill through protocol/toolkit/buckets.py's TokenBucket"
    spent = copies(spends, {BUCKETS}, packages=("node", "protocol", "sampling"))
    assert spent == [], "spend through protocol/toolkit/buckets.py's TokenBucket"


def test_one_loop_reads_frames_and_only_the_server_the_asker_and_the_judge_read_them():
    assert copies(stream_read_loops, {FRAMES}) == [], "read frames with protocol/toolkit/frames.py's read_frame"
    assert copies(frame_reads, FRAME_READERS) == [], "serve and ask with protocol/toolkit/streams.py"


@pytest.mark.parametrize(
    "find, source",
    [
        (popitems, "memory.popitem(last=False)"),
        (refills, "tokens = min(float(BURST), tokens + max(0.0, now - updated) * RATE)"),
        (refills, "tokens = min(float(BURST), tokens + (now - at) / INTERVAL)"),
        (refills, "state.tokens = min(self.burst, state.tokens + elapsed * self.rate)"),
        (spends, "state.tokens -= cost"),
        (spends, "budgets[peer] = (tokens - 1.0 if tokens >= 1.0 else tokens, now)"),
        (spends, "wait = max(0.0, -self._rate_tokens / self.bytes_per_second)"),
        (stream_read_loops, "async def f(stream):\n    while n:\n        chunk = await stream.read(n)"),
        (frame_reads, "payload = await read_frame(stream, 256)"),
    ],
)
def test_each_check_finds_the_copies_it_replaced(find, source):
    """The arithmetic and loops of the copies these parts replaced, as they were written."""
    assert find(ast.parse(source)), source


def test_what_is_not_a_copy_is_not_found():
    assert not refills(ast.parse("state.score = min(0.0, state.score + elapsed * RECOVERY_PER_SECOND)"))
    assert not popitems(ast.parse("memory.popitem()"))
    assert not spends(ast.parse("length = len(tokens)"))
    assert not spends(ast.parse("rate = generation.new_tokens / generation.seconds"))


def test_a_gate_lets_in_whom_its_refusal_does_and_a_default_one_everyone():
    from libp2p.peer.id import ID

    from sapo.protocol.toolkit.peer_gate import PeerGate

    peer = ID(b"\x00\x01")
    open_gate = PeerGate()
    assert open_gate.may_use(peer) and open_gate.refusal(peer) is None and not open_gate.lacks(peer, "/x/1")
    open_gate.count("anything", 2)  # counts nothing, raises nothing
    closed = PeerGate(refusal=lambda p: "banned")
    assert not closed.may_use(peer)
