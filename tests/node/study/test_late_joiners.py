"""Nodes that join a study's run late: they take no part before their round, then start from the
warm start like the founders did; the summary sets what they learned against the founders'
first rounds and against the late joiners of the isolation arms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from sapo.node.cli import main
from sapo.node.core.counters import NodeCounters
from sapo.node.core.memory_exchange import MemoryHub
from sapo.node.study.metrics import late_joiner_metrics, late_joiner_summary
from sapo.node.study.nodes import peer_id_for
from sapo.node.study.settings import ExperimentSettings, parse_configs
from sapo.sampling.inbox import Inbox
from sapo.training.problems.tasks import reasoning_gym_version
from tests.support.groups import honest_group
from tests.support.receiving import memory_for

STUDY = [
    "experiment",
    "--nodes",
    "3",
    "--late-joiners",
    "1",
    "--join-round",
    "3",
    "--configs",
    "8/0,4/4",
    "--rounds",
    "5",
    "--seeds",
    "1",
    "--no-progress",
    "--jobs",
    "1",
    "--tasks",
    "basic_arithmetic",
    "--sampler",
    "uniform",
    "--max-new-tokens",
    "6",
    "--generations",
    "4",
    "--warm-start-steps",
    "0",
    # the untrained model's groups all score 0: kept only by a node that adds its own completions
    "--augment-external",
    "1",
]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("late")
    assert main([*STUDY, "--out", str(out)]) == 0
    return out


def test_a_late_joiner_starts_at_its_round_and_hears_nothing_before(study):
    rows = [json.loads(line) for line in (study / "raw.jsonl").read_text().splitlines()]
    for config in ("8/0", "4/4"):
        of = lambda node: [r for r in rows if r["config"] == config and r["node"] == node]  # noqa: E731
        assert [r["round"] for r in of(0)] == [r["round"] for r in of(1)] == [1, 2, 3, 4, 5]
        assert all("joined" not in r for r in of(0) + of(1))
        assert [r["round"] for r in of(2)] == [3, 4, 5] and all(r["joined"] == 3 for r in of(2))
    shared = lambda node: {r["round"]: r for r in rows if r["config"] == "4/4" and r["node"] == node}  # noqa: E731
    founder, joiner = shared(0), shared(2)
    # a founder hears one peer's 4 groups a round until the joiner is there, then two peers' 8
    assert [founder[r]["accepted"] for r in range(1, 6)] == [4, 8, 16, 24, 32]
    # the joiner received nothing before its round (it was not there), then both founders' groups
    assert [joiner[r]["accepted"] for r in (3, 4, 5)] == [8, 16, 24]
    assert all(joiner[r]["external_groups"] == 4 for r in (3, 4, 5))


def test_the_summary_reports_the_joiners_apart_from_the_founders(study):
    summary = json.loads((study / "summary.json").read_text())
    assert summary["rounds_compared"] == 5  # the founders' rounds, not cut to the joiners' 3
    for config in ("8/0", "4/4"):
        late = summary["results"][config]["late_joiners"]
        assert (late["nodes"], late["join_round"], late["rounds"]) == (1, 3, 3)
        run = summary["runs"][config][0]
        assert run["late_joiners"]["mean_curve"] == [
            r["accuracy"]
            for r in map(json.loads, (study / "raw.jsonl").read_text().splitlines())
            if r["config"] == config and r["node"] == 2
        ]
    text = (study / "summary.md").read_text()
    assert "## Late joiners" in text and "joined at round 3" in text


def test_joiners_are_set_against_the_founders_first_rounds():
    rows = lambda node, start, values: [  # noqa: E731
        {"node": node, "round": start + i, "accuracy": v, **({"joined": start} if start > 1 else {})}
        for i, v in enumerate(values)
    ]
    founders = [rows(0, 1, [0.1, 0.2, 0.3, 0.4]), rows(1, 1, [0.1, 0.2, 0.5, 0.6])]
    joiners = [rows(2, 3, [0.4, 0.6])]
    late = late_joiner_metrics(joiners, founders, last_round=4)
    assert late["rounds"] == 2 and late["join_round"] == 3
    assert late["cumulative_accuracy"] == pytest.approx(1.0)
    assert late["founders_cumulative_accuracy"] == pytest.approx(0.3)  # their rounds 1-2, not 3-4
    assert late["versus_founders"] == pytest.approx(1.0 / 0.3)
    # rounds past the ones compared are left out
    assert late_joiner_metrics(joiners, founders, last_round=3)["rounds"] == 1


def test_the_joiners_ratios_are_paired_per_seed():
    configs = parse_configs(["8/0", "4/0", "4/4"])
    late = lambda cumulative, founders: {  # noqa: E731
        "late_joiners": {
            "nodes": 2,
            "join_round": 51,
            "rounds": 50,
            "cumulative_accuracy": cumulative,
            "founders_cumulative_accuracy": founders,
            "versus_founders": cumulative / founders,
            "accuracy_start": 0.2,
            "accuracy_end": 0.4,
            "heldout": [],
        }
    }
    runs = {
        "8/0": [late(10.0, 10.0), late(20.0, 10.0)],
        "4/0": [late(5.0, 5.0), late(10.0, 5.0)],
        "4/4": [late(15.0, 10.0), late(20.0, 10.0)],
    }
    entry = late_joiner_summary(configs[2], configs, runs["4/4"], runs)
    assert entry["ratio_to_baseline"]["reference"] == "8/0"
    assert entry["ratio_to_baseline"]["cumulative_accuracy"]["ratios"] == [1.5, 1.0]  # seed by seed, not mean / mean
    assert entry["ratio_to_local_only"]["cumulative_accuracy"]["ratios"] == [3.0, 2.0]
    assert entry["versus_founders"]["mean"] == pytest.approx(1.75)
    assert entry["cumulative_accuracy"]["mean"] == pytest.approx(17.5)


async def test_a_lockstep_round_waits_only_for_members_that_have_joined():
    from sapo.node.core.settings import NodeSettings

    hub = MemoryHub(lambda: 1_700_000_000.0, rg_version=reasoning_gym_version(), lockstep=True)
    inboxes = [Inbox(16, 2**20, 600) for _ in range(3)]
    members = [
        hub.join(
            peer_id_for(0, k),
            NodeSettings(),
            memory=memory_for(NodeSettings(), peer_id_for(0, k), inboxes[k]),
            counters=NodeCounters(),
            joins_at=1 if k < 2 else 2,
        )
        for k in range(3)
    ]
    with trio.fail_after(5):  # round 1: the late member is not waited for, and hears nothing
        async with trio.open_nursery() as nursery:
            for k in (0, 1):
                nursery.start_soon(members[k].publish, [honest_group(k)], 1)
    assert [len(inbox) for inbox in inboxes] == [1, 1, 0]
    with trio.fail_after(5):  # round 2: all three
        async with trio.open_nursery() as nursery:
            for k in (0, 1, 2):
                nursery.start_soon(members[k].publish, [honest_group(10 + k)], 2)
    assert [len(inbox) for inbox in inboxes] == [3, 3, 2]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nodes": 4, "late_joiners": 4}, "leaves no node"),
        ({"late_joiners": 2, "rounds": 10, "join_round": 11}, "after the last round"),
        ({"join_round": 5}, "needs --late-joiners"),
        ({"late_joiners": 1, "transport": "libp2p"}, "in-memory transport"),
    ],
)
def test_late_joiner_settings_that_cannot_run_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        ExperimentSettings(**fields)


def test_late_joiners_join_at_half_the_rounds_by_default():
    study = ExperimentSettings(nodes=8, late_joiners=2, rounds=200)
    assert [study.joins_at(k) for k in range(8)] == [1] * 6 + [101, 101]


def test_the_cli_names_a_bad_late_joiner_setting(capsys):
    assert main(["experiment", "--nodes", "2", "--late-joiners", "2", "--rounds", "3", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "invalid settings" in err and "--late-joiners 2" in err
