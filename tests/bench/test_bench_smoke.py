"""The benchmark scripts still run: each one's --smoke mode exits 0 and prints its table."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.question_overlap import previewed_share, rows_of

ROOT = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """`python -m bench.NAME --smoke ARGS`, as bench/README.md runs it, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--smoke", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_round_benchmark_smoke(tmp_path):
    # An empty peers dir: the peer path runs and must say "not installed", whatever this machine has.
    # About 11 s on a quiet 2-core machine; the timeout only catches a hang (at load average 14 it took over 60 s).
    done = run_script(
        "round", "--models-dir", str(tmp_path / "models"), "--peers-dir", str(tmp_path / "peers"), timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "GRPO round benchmark" in out
    assert "memory bandwidth (torch copy, 1 thread):" in out
    times, details, bound = [line for line in out.splitlines() if line.startswith("model ")]
    for column in ("framework", "generate s", "score s", "enc+update s", "total s", "total CPU s", "skipped"):
        assert column in times, times
    for column in ("tok/s", "tok/CPU s", "bound tok/s", "of bound", "peak RSS MB (round)"):
        assert column in details, details
    for column in ("update CPU s", "TFLOP", "fp32 bound s", "of fp32 bound", "bf16 bound s", "of bf16 bound"):
        assert column in bound, bound
    rows = [line for line in out.splitlines() if line.startswith("tiny ")]
    assert len(rows) == 3 and all(row.split()[1] == "sapo" for row in rows[:2]), rows  # no peer row without a peer
    assert rows[0].split()[-1] == "0", f"the smoke round's update was skipped: {rows[0]}"
    assert re.search(r"GFLOPS\) +\d+%", rows[2]), rows[2]  # the update's share of its compute bound
    for peer in ("genrl", "genrl-0.3", "trl"):
        line = next(line for line in out.splitlines() if line.startswith(f"{peer} (tiny) has no row: "))
        assert "not installed" in line and "setup.sh" in line, line


def test_round_benchmark_rejects_unknown_peer(tmp_path):
    done = run_script("round", "--peers", "verl", timeout=60)
    assert done.returncode == 2 and "unknown verl" in done.stderr


def test_bandwidth_smoke(capsys):
    # In this process: the other tests have already paid for importing torch and transformers.
    from bench import bandwidth

    assert bandwidth.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "copy bandwidth, 1 thread:" in out
    row = next(line for line in out.splitlines() if line.startswith("tiny "))
    assert row.split()[1] == "4.0", row  # 997,120 fp32 weights


def test_gossip_benchmark_smoke():
    done = run_script("gossip", timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "gossip benchmark: 3 nodes" in done.stdout
    for label in ("delivered / expected", "latency p50 / p99", "frame bytes per group", "CPU per message"):
        assert label in done.stdout, done.stdout
    delivered = next(line for line in done.stdout.splitlines() if line.startswith("delivered / expected"))
    assert not delivered.rstrip().endswith("= 0.0000"), f"nothing was delivered: {delivered}"


def test_scale_benchmark_smoke(tmp_path):
    # Two tiny swarms in each mode, then the report from their rows alone; about 45 s on 2 idle cores.
    done = run_script("scale", "--out", str(tmp_path), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for heading in ("Real runs, per node", "Validation: each run", "Simulated, per node", "Goal at 10,000 nodes"):
        assert heading in out, out
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert sorted((r["plan"]["mode"], r["plan"]["nodes"]) for r in rows) == [
        ("fetch", 4), ("fetch", 6), ("gossip", 4), ("gossip", 6)
    ]  # fmt: skip
    fetch = [r["result"]["active"]["counters"] for r in rows if r["plan"]["mode"] == "fetch"]
    assert all(c.get("fetch_groups", 0) > 0 and c.get("published", 0) == 0 for c in fetch), fetch
    assert (tmp_path / "scale.png").stat().st_size > 0
    # --report alone rebuilds the same table from the rows
    again = run_script("scale", "--out", str(tmp_path), "--report", timeout=120)
    assert again.returncode == 0 and again.stdout.split("Real runs")[1] == out.split("Real runs")[1]


def test_gossip_during_update_smoke(tmp_path):
    # An estimated 20 s on an idle 2-core machine (12 s of CPU, most of it importing torch and libp2p);
    # the timeout only catches a hang: at load average 19 on 2 cores the same run took 160 s.
    done = run_script("gossip_during_update", "--models-dir", str(tmp_path / "models"), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "gossip latency during a GRPO update" in out
    assert "ratio p99(update) / p99(idle):" in out
    for phase in ("idle", "update"):
        row = next(line for line in out.splitlines() if line.startswith(f"{phase} "))
        assert int(row.split()[2]) > 0, f"no message was timed in the {phase} phase: {row}"
    updates = next(line for line in out.splitlines() if line.startswith("updates: "))
    assert "(0 skipped)" in updates, updates


def test_paper_scale_command_is_a_valid_study():
    """bench/paper_scale.py has never run (no GPU here): at least its command must be one the
    study accepts, with the paper's settings."""
    import shlex

    from sapo.node.study.cli import experiment_node_settings
    from sapo.node.study.settings import ExperimentSettings

    done = subprocess.run(
        [sys.executable, "-m", "bench.paper_scale", "--dry-run"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    command = shlex.split(done.stdout.splitlines()[0].removeprefix("$ "))
    args = command[command.index("experiment") + 1 :]
    study_names = {f"--{name.replace('_', '-')}" for name in ExperimentSettings.model_fields}
    study, node = {}, []
    for i in range(0, len(args), 2):  # every flag here takes one value
        (
            study.__setitem__(args[i][2:].replace("-", "_"), args[i + 1])
            if args[i] in study_names
            else node.extend(args[i : i + 2])
        )
    assert ExperimentSettings(**study).nodes == 8 and study["rounds"] == "2000"
    settings = experiment_node_settings(node)
    assert (
        settings.model.device == "cuda" and settings.training.eps_high == 0.28 and settings.training.reward == "binary"
    )
    assert settings.training.updates_per_batch == 1 and len(settings.tasks.tasks) == 9


def test_author_memory_benchmark_smoke():
    done = run_script("author_memory", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1] and line.split()[0][0].isdigit()]
    assert [(r[0], r[1]) for r in rows] == [("1,000", "0"), ("2,000", "0"), ("2,000", "100")], done.stdout
    assert rows[2][4] == "100"  # 2,200 fresh authors pushed no ban out
    assert all(float(r[2]) > 0 for r in rows)


def test_standing_simulation_smoke():
    done = run_script("standing_sim", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = [re.split(r"\s{2,}", line.strip()) for line in done.stdout.splitlines()]
    shares = {
        (row[0], row[1]): float(row[2].removesuffix(" %")) for row in cells if row[1:2] in (["before"], ["after"])
    }
    assert len(shares) == 8, done.stdout
    # issue #42's bar: honest authors hold 80 % of the draw against every attacker simulated
    assert all(share >= 80.0 for (_, rule), share in shares.items() if rule == "after"), done.stdout
    assert shares[("pushers", "before")] < 40.0  # main's rule: pushers earned faster than honest authors


def test_discovery_benchmark_smoke():
    # sapo, rendezvous and Kademlia on 4 hosts in one process: 32 s at load average 10 on 2 cores
    # (5 hosts); the timeout only catches a hang.
    done = run_script("discovery", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        line.split()[0]: line.split()[1:]
        for line in done.stdout.splitlines()
        if line.split()[:1] in (["sapo"], ["rendezvous"], ["kademlia"])
    }
    assert set(rows) == {"sapo", "rendezvous", "kademlia"}, done.stdout
    for mechanism, (formed, *_rest) in rows.items():
        assert formed != "nan", f"{mechanism} never reached its target: {done.stdout}"


def test_kad_eval_smoke():
    # 6 KadDHT servers and a stranger on 127.0.0.1: about 25 s, 20 of them the lookup waiting out
    # the library's 10 s query timeouts. The numbers are protocol/README.md's; here only that each
    # measure still runs against the pinned library and says what the write-up says it says.
    done = run_script("kad_eval", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = [re.split(r"\s{2,}", line.strip()) for line in done.stdout.splitlines()]
    rows = {cell[0]: cell[1] for cell in cells if len(cell) == 2}
    assert rows["stranger in node 0's table after 2 inbound streams"] == "yes", done.stdout
    assert int(rows["dials to the stranger's tarpit"]) > 0, done.stdout
    assert rows["honest FIND_NODEs answered: before / while a stranger holds 12 silent streams"] == "3 / 0 of 3"
    assert rows["Sybils claiming 200 distinct /24s: admitted to an empty table"] == "200 of 200"


def test_roofline_smoke(capsys, tmp_path):
    # In this process, like the bandwidth smoke: torch and transformers are already imported.
    import torch

    from bench import roofline

    threads = torch.get_num_threads()
    try:
        assert roofline.main(["--smoke", "--models-dir", str(tmp_path / "models")]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "matmul GFLOPS, weights streamed from memory" in out
    shapes = [line.split()[0] for line in out.splitlines() if " x " in line and ("fp32" in line or "bf16" in line)]
    assert {"q", "lm_head", "q|k|v", "gate|up", "down"} <= set(shapes), shapes
    table = out[out.index("decoding, tokens per CPU second") :]
    rows = [line.split() for line in table.splitlines() if line[:2] in ("1 ", "8 ")]
    assert [r[0] for r in rows] == ["1", "8"], table
    for row in rows:  # ours fp32, ours bf16 and generate: positive rates with their share of the roof
        assert float(row[4]) > 0 and float(row[9]) > 0 and float(row[-2]) > 0, row
    assert out.count("real round, sample_completions") == 2


def test_shared_base_smoke(tmp_path):
    done = run_script("shared_base", "--models-dir", str(tmp_path / "models"), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        line.split(":")[0]: line.split()
        for line in done.stdout.splitlines()
        if line.startswith(("separate:", "shared, one by one:", "shared, mixed batch:"))
    }
    assert len(rows) == 3, done.stdout
    # the same work in every mode: the same tokens per swarm-round
    assert len({row[-1] for row in rows.values()}) == 1, rows


def longrun_check(verdict: str) -> tuple[str, str]:
    """(check, node) of a longrun.py verdict line: `PASS  round time  node-0   detail`."""
    return verdict[6:17].strip(), verdict[18:26].strip()


def test_longrun_smoke_samples_every_node_and_renders_the_same_from_its_samples(tmp_path):
    # About 95 s at load average 12 on 2 cores: 3 tiny nodes start, 30 s of 3-s samples, a clean stop.
    out = tmp_path / "run"
    done = run_script("longrun", "--out", str(out), timeout=300)
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: a bound failed; the tiny model's 0.3-s rounds are noisy
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("node     minute round  RSS MB"))
    rows = [line.split()[0] for line in lines[header + 1 :] if line.startswith(("node-", "swarm "))]
    assert sorted(set(rows)) == ["node-0", "node-1", "node-2", "swarm"], lines[header : header + 8]
    verdicts = {longrun_check(line): line for line in lines if line.startswith(("PASS ", "FAIL "))}
    for node in ("node-0", "node-1", "node-2"):
        for check in ("rss", "fds", "threads", "data dir", "log", "metrics", "progress", "cpu/token", "round time"):
            assert (check, node) in verdicts, (check, node, list(verdicts))
        # the swarm rotates node.log: its bound is a cap, and a few KB are well inside it
        log = verdicts[("log", node)]
        assert log.startswith("PASS") and "cap 30 MB" in log, log
    assert (out / "longrun.png").stat().st_size > 10_000
    again = subprocess.run(
        [sys.executable, "-m", "bench.longrun", "--from", str(out), "--table-minutes", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert again.stdout.splitlines()[-len(verdicts) - 1 :] == lines[-len(verdicts) - 1 :]


def test_longrun_verdicts_catch_a_leak_and_pass_a_flat_run(tmp_path, capsys):
    """The bounds, on samples written by hand: one node leaks memory and descriptors, one is flat."""
    import json

    from bench import longrun, longrun_verdicts

    meta = {
        "nodes": 2,
        "node_args": ["--model", "tiny"],
        "minutes": 60,
        "interval": 60,
        "warmup_minutes": 10,
        "keep_checkpoints": 3,
        "log_cap_bytes": 30 << 20,
        "started": "then",
        "note": "",
    }
    rows, cpu = [], {"node-0": 0.0, "node-1": 0.0}
    for minute in range(61):
        for node, leak in (("node-0", 1), ("node-1", 0)):
            cpu[node] += 10.0 + 0.2 * minute * leak  # a round a minute, of 1,000 tokens
            rows.append(
                {
                    "node": node,
                    "time": 1000.0 + 60 * minute,
                    "minute": float(minute),
                    "pid": 1,
                    "round": minute,
                    "rss_bytes": (1000 + 5 * minute * leak) << 20,
                    "fds": 12 + minute // 6 * leak,
                    "threads": 8,
                    "data_dir_bytes": (3 << 20) + 1000 * minute,
                    "checkpoints_bytes": 3 << 20,
                    "checkpoints": 3,
                    "metrics_bytes": 1000 * minute,
                    "logs_bytes": 0,
                    "log_files": 1,
                    "inbox_size": 40,
                    "rounds": [[minute, 30.0 + 0.5 * minute * leak, 1000.0 + 60 * minute, 1000]],
                    "cpu_seconds": cpu[node],
                    "load": 1.0,
                }
            )
    (tmp_path / "run.json").write_text(json.dumps(meta))
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert longrun.report(tmp_path, 10.0) == 1
    verdicts = {
        longrun_check(line): line[:4]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith(("PASS ", "FAIL "))
    }
    assert verdicts[("rss", "node-0")] == "FAIL" and verdicts[("rss", "node-1")] == "PASS"
    assert verdicts[("fds", "node-0")] == "FAIL" and verdicts[("fds", "node-1")] == "PASS"
    assert verdicts[("threads", "node-0")] == verdicts[("threads", "node-1")] == "PASS"
    results = {(v.check, v.node): v.passed for v in longrun_verdicts.verdicts(meta, rows)}
    assert results[("round time", "node-0")] is False and results[("round time", "node-1")] is True
    assert results[("cpu/token", "node-0")] is False and results[("cpu/token", "node-1")] is True
    assert results[("data dir", "node-1")] is True


def test_update_profile_smoke():
    done = run_script("update_profile", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    for setting in ("1x1", "2x2"):
        assert f"{setting} (updates_per_batch x minibatches)" in done.stdout, done.stdout
    for bucket in ("base linears", "attention", "optimizer", "outside torch ops"):
        assert bucket in done.stdout, done.stdout
    assert "frozen weights with a gradient: 0" in done.stdout


def test_poisoning_benchmark_smoke(tmp_path):
    # Two honest tiny nodes and one attacker for 6 rounds through the real intake, inbox and screen
    # (about a minute quiet, with the warm start; 285 s at load average 8).
    done = run_script("poisoning", "--attack", "out-of-context", "--out", str(tmp_path / "run"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    header, _, result = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert "success per 3 rounds" in header and "ROC AUC" in header, header
    cells = [c.strip() for c in result.split("|")[1:-1]]
    assert cells[1:5] == ["out-of-context", "1/3", "on", "6"], cells
    rows = [json.loads(line) for line in (tmp_path / "run" / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(r["completions"] > 0 for r in rows)
    assert sum(r["from_attackers"] for r in rows) == 0  # no attacking group was trained on


def test_screen_roc_smoke(tmp_path):
    # A briefly warm-started tiny model: its own completions set the bar, a peer's rewritten with a phrase stand above it.
    done = run_script(
        "screen_roc", "--models-dir", str(tmp_path / "models"), "--out", str(tmp_path / "roc.json"), timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "roc.json").read_text())
    assert set(result["statistics"]) == {"excess, worst 4", "excess, worst 16", "excess, whole", "NLL, worst 16"}
    assert result["counts"]["out-of-context"] > 0 and result["refused_at_bar"]["out-of-context"] == 1.0
    assert result["refused_at_bar"]["honest peer"] == 0.0


def test_hostile_answers_benchmark_smoke():
    # Every task's worst known answers through the scorer and the real intake, and the worker process's round trip.
    done = run_script("hostile_answers", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "ms" in line]
    assert len(rows) == 9, done.stdout
    assert all("(1)" in row.split("|")[2] for row in rows)  # the key is right
    assert all("(0)" in cell for row in rows for cell in row.split("|")[3:9])  # every hostile answer is not
    assert "in a limited worker process" in done.stdout


def test_question_overlap_counts_the_questions_peers_showed_first():
    # issue #42: neighbouring seeds walked one ReasoningGYM sequence, so a node had been sent most
    # of its own questions by a peer first; on streams of their own, none
    results = Path(__file__).parents[2] / "bench" / "results" / "tiny-heterogeneous-streams"
    clean = [r for r in rows_of(results) if r["config"] == "adaptive"]
    unmatched = [r for r in rows_of(results / "diagnosis" / "unmatched") if r["config"] == "adaptive"]
    total, previewed = previewed_share(clean, base_seed=0, stride=2**31)
    assert total > 10_000 and previewed == 0
    total, previewed = previewed_share(unmatched, base_seed=0, stride=1)
    assert 0.7 < previewed / total < 0.8  # 75.5 %


def test_standing_swarm_smoke(tmp_path):
    # A real swarm in network namespaces (bench/wild.py --standing): 4 honest fetching nodes,
    # 2 keys posing as older releases that push on the topic, 2 late keys; 36 s with a 10 s ramp.
    from bench import wild_net

    problem = wild_net.available()
    if problem:
        pytest.skip(f"needs network namespaces: {problem}")
    done = run_script("wild", "--standing", "--out", str(tmp_path), timeout=150)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    honest = [r for r in rows if r["kind"] == "node" and r["role"] == "honest"]
    assert len(honest) == 4 and all(r["standing"] for r in honest), done.stdout
    # the attack happened: pushers published, and their groups reached an honest node's intake
    assert sum(r["pushed"] for r in rows if r.get("role") == "pusher") > 0
    assert sum(sum(r["by_author_kind"].get("pusher", {}).values()) for r in honest) > 0, done.stdout
    assert all(r["standing"]["table"]["both"]["honest_share"] is not None for r in honest)
    assert "honest authors' share of each honest node's weight" in done.stdout
    assert "what reached the 4 honest nodes' intake" in done.stdout
