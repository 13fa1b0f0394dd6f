"""Every bad setting is refused before anything loads or is written: by `start --dry-run`, by a
real `start` and by `swarm`, within 2 s, naming the flag, the value and the fix, with no
traceback, and leaving the data dir exactly as it was."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.processes import sapo_node

GOOD_ID = "12D3KooWLxXydXxaSwjPDk6SeRkMHtB2ZDM5V5N3948EbaK2eUiP"

# (flags, what the message must say); {tmp} is the test's own directory
BAD = [
    (
        ["--peers", "not-a-multiaddr"],
        "--peers not-a-multiaddr (command line): peer address 'not-a-multiaddr' is not a multiaddr",
    ),
    (["--peers", "/ip4/127.0.0.1/tcp/4001"], "is not /ip4|ip6|dns|dns4|dns6/<host>/tcp/<port>/p2p/<peer id>"),
    (["--local", "0", "--external", "0"], "--local 0 with --external 0 trains on nothing"),
    (
        ["--model", "/nonexistent/path"],
        "--model '/nonexistent/path' (command line): model path '/nonexistent/path' does not exist",
    ),
    (["--model", "not a model!"], "is neither a tiny variant"),
    (["--sampler", "bogus"], "--sampler 'bogus' (command line): Input should be 'nonzero-uniform'"),
    (["--tasks", "not_a_task"], "unknown task(s) ['not_a_task']; choose from"),
    (["--swarm-key", "{tmp}/missing.key"], "cannot read swarm key"),
    (["--swarm-key", "{tmp}/bad.key"], "is not a libp2p swarm.key file"),
    (["--allow-peers", "not-a-peer-id"], "allowed peer 'not-a-peer-id' is not a base58 peer id"),
    (["--judge", "/ip4/127.0.0.1/tcp/4101"], "copy the 'judge listening on ...' line"),
    (["--listen", "garbage"], "listen address 'garbage' is not a multiaddr"),
    (
        ["--warm-start-steps", "10", "--lora"],
        "--warm-start-steps trains the full model; it cannot be combined with --lora",
    ),
    (["--device", "tpu"], "unknown device 'tpu'; choose auto, cpu, cuda, cuda:N or mps"),
    (["--lr", "-1"], "--lr '-1' (command line): Input should be greater than 0"),
    (["--task-config", '{"basic_arithmetic": {"max_digits": 99}}'], "basic_arithmetic.max_digits must be in"),
    (["--generate-only", "--local", "0", "--external", "2"], "neither trains nor publishes"),
    (["--balance", "adaptive", "--local", "0"], "keeps at least one local group"),
    (["--identity-seed", "xyz"], "--identity-seed 'xyz' (command line)"),
    (["--config", "{tmp}/missing.toml"], "does not exist"),
    (["--max-new-tokens", "0"], "--max-new-tokens '0' (command line): Input should be greater than or equal to 1"),
]


def _flags(flags: list[str], tmp: Path) -> list[str]:
    return [f.replace("{tmp}", str(tmp)) for f in flags]


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(directory.rglob("*"))
    }


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "bad.key").write_text("/key/swarm/psk/1.0.0/\n/base64/\nnot-hex\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("a user's file: must survive")
    return tmp_path


@pytest.mark.parametrize("flags, message", BAD, ids=[" ".join(f) for f, _ in BAD])
@pytest.mark.parametrize(
    "command", [["start", "--dry-run"], ["start"], ["swarm", "--nodes", "2"]], ids=["dry-run", "start", "swarm"]
)
def test_bad_setting_is_refused_before_anything_loads(workdir, command, flags, message):
    before = _snapshot(workdir)
    if command[0] == "swarm":
        where = ["--data-dir", str(workdir / "swarm")]
        if flags[0] in ("--peers", "--listen"):  # set per node by the swarm itself
            message = f"{flags[0]}: the swarm sets --data-dir, --listen, --peers, --seed per node itself"
    else:
        where = [
            "--data-dir",
            str(workdir / "data"),
            *([] if flags[0] == "--listen" else ["--listen", "/ip4/127.0.0.1/tcp/0"]),
        ]
    started = time.perf_counter()
    result = sapo_node(*command, *where, *_flags(flags, workdir), timeout=30)
    seconds = time.perf_counter() - started
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert seconds < 2.0, f"took {seconds:.2f} s to refuse"
    assert result.stderr.startswith("sapo-node: invalid settings:\n"), result.stderr
    assert _flags([message], workdir)[0] in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "validation error" not in result.stderr  # never a raw pydantic dump
    assert result.stdout == ""
    assert _snapshot(workdir) == before  # nothing written: no identity.key, no models, no swarm dirs
