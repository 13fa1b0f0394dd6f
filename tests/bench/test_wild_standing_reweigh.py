"""bench/wild_standing_reweigh.py: a --standing run's end, weighed again offline. What each
author's clock can have been is read off the rows, and the committed run 2 reads back."""

from __future__ import annotations

from pathlib import Path

from bench.wild_standing_reweigh import clocks, main, recency

ROOT = Path(__file__).resolve().parents[2]
T0, RAMP = 1_000.0, 600.0


def test_each_clock_is_read_off_the_end_and_the_snapshots_that_counted_its_kind():
    at = T0 + 3600
    row = {
        "standing": {
            "at": at,
            "authors": {
                "h-early": ["honest", 1.0, "a", 1.0],
                "h-late": ["honest", 1.0, "b", 1.0],
                "h-ramping": ["honest", 0.25, "c", 0.3],
                "p": ["pusher", 1.0, "d", 1.0],
            },
        },
        # counted: one honest author by minute 30, the other by minute 45, the pusher by minute 5
        "standing_over_time": [
            {"t": 300.0, "table": {"authors": {"pusher": 1}}},
            {"t": 1800.0, "table": {"authors": {"honest": 1, "pusher": 1}}},
            {"t": 2700.0, "table": {"authors": {"honest": 2, "pusher": 1}}},
            {"t": 3300.0, "table": {"authors": {"honest": 3, "pusher": 1}}},
        ],
    }
    got = clocks(row, T0, RAMP)
    assert (got["h-ramping"].earliest, got["h-ramping"].latest) == (at - 150, at - 150)
    assert (got["p"].earliest, got["p"].latest) == (T0, T0 + 300)
    # which honest author was counted first the rows do not say; the windows are what they allow
    assert sorted((c.earliest, c.latest) for a, c in got.items() if a.startswith("h-") and c.standing == 1.0) == [
        (T0 + 300, T0 + 1800),
        (T0 + 1800, T0 + 2700),
    ]
    kinds = {a: recency(c, at, RAMP) for a, c in got.items()}
    assert kinds == {"h-early": "before", "h-late": "either", "h-ramping": "recent", "p": "before"}


def test_run_2_reads_back_and_is_weighed_again(capsys):
    """The rows' own shares come back as the run reported them (bench/results/standing-swarm/
    README.md), and every reconstructed clock gives back the standing the node recorded (the
    script refuses otherwise)."""
    assert main(["--out", str(ROOT / "bench/results/standing-swarm"), "--run", "2026-12-06T13:06:45"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OFFLINE:")
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.split()[:1] in (["pushers"], ["late"], ["both"])
    }
    assert [rows[k][1] for k in ("pushers", "late", "both")] == ["87.3", "80.5", "72.2"]
