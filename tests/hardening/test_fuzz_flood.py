"""CI-sized versions of bench/soak.py: 2,000 hostile frames, and a few seconds of flood."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("sapo_bench_soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


def test_2000_hostile_frames_raise_nothing(soak):
    report = soak.fuzz(2000, seed=1, hypothesis_cases=1000)
    print("\n" + "\n".join(report.lines()))
    assert report.cases == 2000
    assert not report.escaped, report.escaped
    rejected = sum(report.decode_rejected.values())
    assert rejected + report.decoded == report.cases
    assert len(report.decode_rejected) >= 5  # many distinct reasons were exercised


def test_flood_leaves_room_for_the_honest_peer_and_a_bounded_inbox(soak, tmp_path):
    report = soak.flood(seconds=6, rate=400, workdir=tmp_path)
    print("\n" + "\n".join(report.lines()))
    assert report.node_alive
    assert report.honest_accepted > 0
    assert report.inbox_peak <= report.inbox_cap
    assert report.rounds_during > 0, "training stalled under the flood"
