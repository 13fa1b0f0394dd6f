"""A peer whose groups are all refused, for hours, costs the log a line a minute, not a line a
group; every refusal is still counted."""

from __future__ import annotations

import logging

from sapo.node.core.counters import NodeCounters
from sapo.protocol.wire.codec import encode
from sapo.protocol.wire.verify import VerifyPolicy
from sapo.sampling.inbox import Inbox
from tests.support.receiving import Receiver, memory_of
from tests.support.strategies import SAMPLE_SENDER, sample_message

START = 1_700_000_000.0


def stale_frames(count: int) -> list[bytes]:
    # distinct frames (not replays), each created long before it arrives
    return [encode(sample_message(sender_round=i + 1, created_at=START - 3600)) for i in range(count)]


def intake(counters: NodeCounters) -> Receiver:
    return Receiver(
        memory_of(
            Inbox(512, 64 << 20, 1e12, 0.25),
            counters=counters,
            swarm="sapo-test",
            local_peer_id="me",
            rg_version="0.1.25",
            policy=VerifyPolicy(accept_other_rg_versions=True),
            max_age_seconds=600,
        )
    )


def test_ten_minutes_of_refused_groups_log_a_summary_a_minute_and_count_every_one(caplog):
    counters = NodeCounters()
    checks = intake(counters)
    frames = stale_frames(600)
    with caplog.at_level(logging.INFO, logger="sapo.intake"):
        for second, frame in enumerate(frames):  # one a second for ten minutes
            assert checks.accept(frame, SAMPLE_SENDER, START + second) is None
    assert counters.rejected["stale"] == 600
    lines = [r.getMessage() for r in caplog.records if r.name == "sapo.intake" and r.levelno >= logging.INFO]
    # the first refusal at once, then one summary a minute
    assert len(lines) == 10, lines[:5]
    assert lines[0].startswith("refused 1 group(s) from 1 peer(s) in 0 s: stale 1 (latest: stale from ")
    assert "created 3600s ago" in lines[0]
    assert all(line.startswith("refused 60 group(s) from 1 peer(s) in 59 s: stale 60") for line in lines[1:]), lines[
        1:3
    ]


def test_each_refused_group_is_still_a_debug_line(caplog):
    checks = intake(NodeCounters())
    with caplog.at_level(logging.DEBUG, logger="sapo.intake"):
        for second, frame in enumerate(stale_frames(5)):
            checks.accept(frame, SAMPLE_SENDER, START + second)
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 5 and all(": stale: created " in line for line in debug), debug
