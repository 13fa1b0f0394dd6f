"""bench/capture.py in small: the target and 6 honest nodes in their namespaces, 8 attacker hosts
in 4 /16s feeding the target dead Sybil records, one or two rounds measured; the rows hold the
target's rounds, its logged draw and the attack's counts, and the report reads them back.
Needs root, `ip` and `nft` (skipped otherwise); about a minute."""

from __future__ import annotations

import json
import os

import pytest

from bench import capture, wild_net


def test_a_tiny_capture_run_measures_the_target_under_attack(tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    problem = wild_net.available()
    if problem:
        pytest.skip(f"network namespaces unavailable: {problem}")
    args = ["--arms", "dead", "--hosts-per-group", "2", "--attack-start", "3", "--batch-seconds", "5"]
    args += ["--warmup-seconds", "15", "--measure-seconds", "20", "--start-delay", "20", "--out", str(tmp_path)]
    assert capture.main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    (header,) = [r for r in rows if r["kind"] == "arm"]
    assert header["failed_processes"] == []
    nodes = [r for r in rows if r["kind"] == "node"]
    assert len(nodes) == 7
    target = next(n for n in nodes if n["ip"] == header["plan"]["lives"][0]["ip"])
    assert any(t >= 15 for t, *_ in target["rounds"]), target["rounds"]
    assert target["draws"], "the target's fetcher drew no author"
    (attack,) = [r for r in rows if r["kind"] == "attack"]
    assert len(attack["hosts"]) == 8
    assert attack["counts"]["connected"] >= 1  # the attackers reached the target from their /16s
    assert wild_net.remove(capture.PREFIX + str(os.getpid() % 100000)) == []  # nothing left behind
    assert "arm dead: target accepted" in capsys.readouterr().out
