"""`sapo-node start` end to end, through the real CLI in child processes."""

import json

from tests.support.processes import FAST_TINY, read_metrics, sapo_node

REQUIRED_KEYS = {
    "round",
    "reward_mean",
    "cumulative_reward",
    "local_groups",
    "external_groups",
    "inbox_size",
    "generate_seconds",
    "train_seconds",
    "round_seconds",
    "per_task",
}


def test_tiny_node_runs_rounds_checkpoints_and_resumes(tmp_path):
    data = tmp_path / "node"
    first = sapo_node("start", *FAST_TINY, "--rounds", "3", "--data-dir", str(data))
    assert first.returncode == 0, first.stderr[-3000:]
    rows = read_metrics(data)
    assert [r["round"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert REQUIRED_KEYS <= row.keys()
        assert row["external_groups"] == 0 and row["local_groups"] + row["external_planned"] == 8
    # the default balance is adaptive, and a node alone finds no external groups: it plans its
    # centre, 4/4, every round (no probes without peers' groups), so it trains on 4 local groups
    assert [(r["local_groups"], r["external_planned"]) for r in rows] == [(4, 4)] * 3
    assert rows[-1]["cumulative_reward"] == sum(r["reward_mean"] for r in rows)
    assert "listening on /ip4/127.0.0.1/tcp/" in first.stdout
    peer_line = next(line for line in first.stdout.splitlines() if line.startswith("listening on"))

    second = sapo_node("start", *FAST_TINY, "--rounds", "5", "--data-dir", str(data))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and "at round 3" in second.stderr
    assert [r["round"] for r in read_metrics(data)] == [1, 2, 3, 4, 5]
    # same identity, so the same peer id
    assert peer_line.split("/p2p/")[1] in second.stdout
    state = json.loads((data / "checkpoints" / "round-00000005" / "state.json").read_text())
    assert state["round"] == 5


def test_checkpoint_model_loads_with_plain_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = tmp_path / "node"
    assert sapo_node("start", *FAST_TINY, "--rounds", "1", "--data-dir", str(data)).returncode == 0
    model_dir = data / "checkpoints" / "round-00000001" / "model"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.model_type == "llama" and tokenizer("12").input_ids


def test_corrupt_checkpoint_falls_back_and_says_which_file(tmp_path):
    data = tmp_path / "node"
    args = [*FAST_TINY, "--checkpoint-every", "1", "--data-dir", str(data)]
    assert sapo_node("start", *args, "--rounds", "2").returncode == 0
    (data / "checkpoints" / "round-00000002" / "model" / "model.safetensors").write_bytes(b"broken")
    again = sapo_node("start", *args, "--rounds", "3")
    assert again.returncode == 0
    assert "round-00000002/model/model.safetensors" in again.stderr
    assert "resumed from" in again.stderr and "at round 1" in again.stderr
    assert [r["round"] for r in read_metrics(data)] == [1, 2, 3]


def test_bad_settings_and_missing_model_are_clear_errors(tmp_path):
    bad = sapo_node("start", "--lr", "-1", "--data-dir", str(tmp_path))
    assert bad.returncode == 2 and "--lr '-1' (command line)" in bad.stderr
    missing = sapo_node(
        "start",
        "--model",
        str(tmp_path / "no-such-model"),
        "--data-dir",
        str(tmp_path / "d"),
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr and not (tmp_path / "d").exists()  # refused before anything is written


def test_smollm2_default_runs_one_full_round_offline(tmp_path, shared_models_dir):
    data = tmp_path / "smol"
    result = sapo_node(
        "start",
        "--rounds",
        "1",
        "--generations",
        "2",
        "--max-new-tokens",
        "32",
        "--data-dir",
        str(data),
        "--models-dir",
        str(shared_models_dir),
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        timeout=600,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = read_metrics(data)
    assert (
        row["round"] == 1 and row["local_groups"] == 4 and row["generated_tokens"] > 0
    )  # no probe before a peer is seen: the centre, 4/4
    assert (data / "checkpoints" / "round-00000001" / "model" / "model.safetensors").exists()


def test_lora_node_trains_an_adapter_and_resumes(tmp_path):
    data = tmp_path / "lora"
    args = [*FAST_TINY, "--lora", "--lora-rank", "4", "--data-dir", str(data)]
    first = sapo_node("start", *args, "--rounds", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    model_dir = data / "checkpoints" / "round-00000001" / "model"
    assert (model_dir / "adapter_config.json").exists() and (model_dir / "adapter_model.safetensors").exists()
    second = sapo_node("start", *args, "--rounds", "2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "at round 1" in second.stderr
    assert [r["round"] for r in read_metrics(data)] == [1, 2]


def test_generate_only_node_publishes_but_never_trains(tmp_path):
    data = tmp_path / "gen"
    result = sapo_node(
        "start", *FAST_TINY, "--generate-only", "--sampler", "uniform", "--rounds", "2", "--data-dir", str(data)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(data)
    assert all(r["loss"] is None and r["train_seconds"] == 0 for r in rows)
    assert all(r["local_groups"] == 4 for r in rows)  # a generator keeps its I: the adaptive default is off


def test_the_daemon_hands_the_gil_over_every_millisecond(monkeypatch, tmp_path):
    """Generation holds the GIL between torch ops; the daemon shortens Python's forced switch
    (5 ms) so that its trio loop, which serves gossip, waits less (docs/bench/gossip-during-update.md)."""
    import sys

    from sapo.node.cli import main
    from sapo.node.daemon import run

    seen = []

    async def fake_run_node(settings, parent=None):  # stands in for the whole daemon: only the process setup is tested
        seen.append(sys.getswitchinterval())

    monkeypatch.setattr(run, "run_node", fake_run_node)
    before = sys.getswitchinterval()
    try:
        assert main(["start", *FAST_TINY, "--rounds", "0", "--data-dir", str(tmp_path)]) == 0
    finally:
        sys.setswitchinterval(before)
    assert seen == [0.001]
