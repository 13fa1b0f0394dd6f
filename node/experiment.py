"""The controlled I/J study: every node in one process, lockstep rounds, an in-memory exchange.

Each node is the daemon's own `Node` (same generation, verifier, mixing and GRPO step), and every
shared group goes through `GroupEncoder.frame` -> codec -> `Intake.accept` (decode, checks,
regeneration, re-scoring) -> the receiver's inbox, so the study exercises the real wire path.

Round visibility: within round r every node first generates its local groups and publishes them;
then the hub delivers all frames; then each node mixes and trains. So node k's round-r groups are
visible to the others *in the same round r*, as in the paper's controlled run. Time is a round
clock (round r happens at T0 + r * round_seconds, default 1000 s), so with the default inbox
max age (600 s) only the current round's groups are eligible; pass a larger
--inbox-max-age-seconds to let older groups stay eligible.

Metrics (also written into summary.json and summary.md):
- reward(k, t): mean verifier reward of node k's *local* completions in round t;
- cumulative reward: sum over rounds of reward(k, t), averaged over the learning nodes (the
  paper's metric; a raw sum over all rollouts would favour configs that generate more);
- MA curve: the trailing moving average, window w = 100 (a third of the rounds if shorter), of the node-averaged
  reward; peak = its maximum; oscillation = mean |MA(t+1) - MA(t)| after the peak (0 if the peak
  is the last point).
Scripted solvers are peers, not learners: they are excluded from every metric.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from sapo.node.core import Node, warm_start_settings
from sapo.node.counters import NodeCounters
from sapo.node.experiment_settings import (  # noqa: F401 - re-exported for callers
    CLOCK_EPOCH,
    EXPERIMENT_NODE_DEFAULTS,
    MA_WINDOW,
    METRIC_DEFINITIONS,
    ExperimentSettings,
    MixConfig,
    parse_configs,
)
from sapo.node.memory_exchange import MemoryExchange, MemoryHub
from sapo.node.settings import NodeSettings
from sapo.training.generation import GenerationResult
from sapo.training.scripted import ScriptedSolver
from sapo.training.tasks import TaskSampler, TaskSpec, reasoning_gym_version

log = logging.getLogger("sapo.experiment")

SIZE_CYCLE = ("tiny-micro", "tiny-small", "tiny")  # 0.13M, 0.45M, 1M: 8x apart, all CPU-friendly
TOKENIZER_CYCLE = ("tiny", "tiny-bpe")


def peer_id_for(seed: int, index: int, role: str = "node") -> str:
    """A stable base58 id shaped like a libp2p peer id (the wire checks the alphabet)."""
    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
    digest = hashlib.sha256(f"{role}-{seed}-{index}".encode()).digest()
    return "12D3KooW" + "".join(alphabet[b % 58] for b in digest[:44])


def node_model(base: NodeSettings, study: ExperimentSettings, index: int) -> str:
    if study.mixed_sizes:
        return SIZE_CYCLE[index % len(SIZE_CYCLE)]
    if study.mixed_tokenizers:
        return TOKENIZER_CYCLE[index % len(TOKENIZER_CYCLE)]
    return base.model.model


def specialist_tasks(tasks: list[TaskSpec], nodes: int, index: int) -> list[TaskSpec]:
    if len(tasks) < 2:
        raise ValueError("--specialists needs at least two --tasks to split among the nodes")
    shares = min(len(tasks), nodes)
    return [t for i, t in enumerate(tasks) if i % shares == index % shares]


def node_settings(
    base: NodeSettings, study: ExperimentSettings, config: MixConfig, seed: int, index: int, run_dir: Path
) -> NodeSettings:
    model_updates: dict[str, Any] = {
        "model": node_model(base, study, index),
        "models_dir": base.model.models_dir or study.out / "models",
    }
    if study.format_discovery is not None:
        model_updates["warm_start_tag_rate"] = study.format_discovery
    return base.model_copy(
        update={
            "model": base.model.model_copy(update=model_updates),
            "sampling": base.sampling.model_copy(
                update={"local": config.local, "external": config.external, "balance": "adaptive" if config.adaptive else "fixed"}
            ),
            "run": base.run.model_copy(update={"data_dir": run_dir / f"node-{index}", "seed": base.run.seed + 1000 * seed + index}),
        }
    )


class _RecordsInMemory:
    """Stands in for Node.metrics during a study: no fsync per node-round; written once at the end."""

    def __init__(self, path: Path):
        self.path = path
        self.records: list = []

    def append(self, record) -> None:
        self.records.append(record)

    def flush(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(r.model_dump_json() + "\n" for r in self.records))


@dataclass
class Learner:
    index: int
    node: Node
    exchange: MemoryExchange

    @property
    def records(self) -> list:
        return self.node.metrics.records


@dataclass
class ScriptedPeer:
    index: int
    solver: ScriptedSolver
    tasks: TaskSampler
    exchange: MemoryExchange
    generations: int
    local: int


class RoundClock:
    def __init__(self, round_seconds: float):
        self.round_seconds = round_seconds
        self.round = 0

    def __call__(self) -> float:
        return CLOCK_EPOCH + self.round * self.round_seconds


def build_run(base: NodeSettings, study: ExperimentSettings, config: MixConfig, seed: int, run_dir: Path):
    clock = RoundClock(study.round_seconds)
    hub = MemoryHub(clock, swarm="experiment", rg_version=reasoning_gym_version())
    learners = []
    for k in range(study.nodes):
        settings = node_settings(base, study, config, seed, k, run_dir)
        tasks = specialist_tasks(settings.tasks.specs(), study.nodes, k) if study.specialists else None
        node = Node(settings, peer_id=peer_id_for(seed, k), warm_start_tasks=tasks)
        node.metrics = _RecordsInMemory(node.metrics.path)
        receives = config.adaptive or config.external > 0
        net = settings.network
        exchange = hub.join(
            node.peer_id,
            model_id=settings.model.model,
            inbox=node.inbox if receives else None,
            counters=node.counters,
            max_message_bytes=net.max_message_bytes,
            max_age_seconds=settings.sampling.inbox_max_age_seconds,
            accept_other_rg_versions=net.accept_other_rg_versions,
            compress=net.compress,
        )
        learners.append(Learner(k, node, exchange))
    solvers = []
    for k in range(study.scripted_solvers):
        peer_seed = base.run.seed + 1000 * seed + 500 + k
        exchange = hub.join(
            peer_id_for(seed, k, "solver"), model_id="scripted", inbox=None, counters=NodeCounters(),
            max_message_bytes=base.network.max_message_bytes, max_age_seconds=base.sampling.inbox_max_age_seconds,
        )
        solvers.append(
            ScriptedPeer(
                k, ScriptedSolver(study.solver_accuracy, seed=peer_seed),
                TaskSampler(base.tasks.specs(), dataset_seed=peer_seed, rng_seed=peer_seed), exchange,
                base.training.generations, config.local,
            )
        )
    return clock, hub, learners, solvers


def lockstep_round(
    round_index: int, clock: RoundClock, hub: MemoryHub, learners: list[Learner], solvers: list[ScriptedPeer]
) -> list[dict]:
    """One lockstep round: all generate and publish, the hub delivers, then each mixes, trains, records."""
    clock.round = round_index
    generations: list[tuple[GenerationResult, int, float]] = []
    for learner in learners:
        started = time.perf_counter()
        generation = learner.node.generate(round_index)
        learner.exchange.publish(generation.groups, round_index)
        generations.append((generation, time.perf_counter() - started))
    for peer in solvers:
        generation = peer.solver.generate_groups(peer.tasks.sample(peer.local), peer.generations, round_index)
        peer.exchange.publish(generation.groups, round_index)
    hub.deliver()
    rows = []
    for learner, (generation, seconds) in zip(learners, generations):
        node = learner.node
        started = time.perf_counter()
        training_set = node.mix(generation, now=clock())
        update = node.train(training_set)
        seconds += time.perf_counter() - started
        record = node.record(round_index, generation, training_set, update, seconds, learner.exchange.peers())
        rows.append(
            {
                "node": learner.index,
                "peer_id": node.peer_id,
                "model": node.settings.model.model,
                "round": round_index,
                "reward": record.reward_mean,
                "format_rate": record.format_rate,
                "local_groups": record.local_groups,
                "external_groups": record.external_groups,
                "external_reward_mean": record.external_reward_mean,
                "inbox_size": record.inbox_size,
                "accepted": record.accepted,
                "rejected": record.rejected,
                "loss": record.loss,
                "generate_seconds": record.generate_seconds,
                "train_seconds": record.train_seconds,
                "round_seconds": seconds,
            }
        )
    return rows


# --- metrics ---------------------------------------------------------------------------------


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over `window` points, one per full window (point i ends at round i + window)."""
    if window < 1 or len(values) < window:
        return []
    out, running = [], sum(values[:window])
    out.append(running / window)
    for i in range(window, len(values)):
        running += values[i] - values[i - window]
        out.append(running / window)
    return out


def curve_metrics(per_node_rewards: list[list[float]], window: int = MA_WINDOW) -> dict[str, Any]:
    rounds = len(per_node_rewards[0])
    mean_curve = [sum(col) / len(col) for col in zip(*per_node_rewards)]
    window = min(window, rounds)
    ma = moving_average(mean_curve, window)
    peak = max(range(len(ma)), key=ma.__getitem__)
    after = ma[peak:]
    steps = [abs(b - a) for a, b in zip(after, after[1:])]
    return {
        "cumulative_reward": sum(sum(r) for r in per_node_rewards) / len(per_node_rewards),
        "cumulative_per_node": [sum(r) for r in per_node_rewards],
        "peak_ma": ma[peak],
        "peak_round": peak + window,
        "oscillation": sum(steps) / len(steps) if steps else 0.0,
        "final_ma": ma[-1],
        "ma_window": window,
        "mean_curve": mean_curve,
        "ma_curve": ma,
    }


FORMAT_WINDOW = 10
SPREAD_WINDOW = 5
SPREAD_FORMAT = 0.9
SPREAD_REWARD = 0.5


def spread_metrics(per_node: list[list[float]], threshold: float = SPREAD_FORMAT) -> dict[str, Any]:
    """How fast something spreads through the swarm: per node, the first round at which its
    trailing SPREAD_WINDOW-round mean reaches `threshold` (None if never); the swarm has it when
    its last node does."""
    firsts = []
    for curve in per_node:
        window = min(SPREAD_WINDOW, len(curve))
        ma = moving_average(curve, window)
        firsts.append(next((i + window for i, v in enumerate(ma) if v >= threshold), None))
    reached = [f for f in firsts if f is not None]
    return {
        "threshold": threshold,
        "first_round_per_node": firsts,
        "nodes_reached": len(reached),
        "first_node_round": min(reached) if reached else None,
        "all_nodes_round": max(reached) if len(reached) == len(firsts) else None,
    }


def _mean_std(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def summarize(configs: list[MixConfig], runs: dict[str, list[dict]]) -> dict[str, Any]:
    """Mean ± std over seeds per config, and paired ratios to T/0 and to I/0 where those arms exist."""
    def local_only(local: int) -> str | None:
        return next((c.name for c in configs if not c.adaptive and c.external == 0 and c.local == local), None)

    out: dict[str, Any] = {}
    for config in configs:
        seeds = runs[config.name]
        entry: dict[str, Any] = {
            key: _mean_std([s["metrics"][key] for s in seeds])
            for key in ("cumulative_reward", "peak_ma", "oscillation", "final_ma")
        }
        for label, ref in (("ratio_to_baseline", local_only(config.total)), ("ratio_to_local_only", local_only(config.local))):
            if ref is None or ref == config.name or config.adaptive and label == "ratio_to_local_only":
                continue
            ratios = [s["metrics"]["cumulative_reward"] / r["metrics"]["cumulative_reward"]
                      for s, r in zip(seeds, runs[ref]) if r["metrics"]["cumulative_reward"] > 0]
            if ratios:
                entry[label] = _mean_std(ratios) | {"reference": ref}
        entry["spread"] = {
            kind: {
                "threshold": seeds[0][kind]["threshold"],
                "first_node_round": [s[kind]["first_node_round"] for s in seeds],
                "all_nodes_round": [s[kind]["all_nodes_round"] for s in seeds],
                "nodes_reached": [s[kind]["nodes_reached"] for s in seeds],
            }
            for kind in ("format", "accuracy")
        }
        tenth = max(1, len(seeds[0]["metrics"]["format_curve"]) // 10)
        entry["format_rate_start"] = _mean_std([statistics.fmean(s["metrics"]["format_curve"][:tenth]) for s in seeds])
        entry["format_rate_end"] = _mean_std([statistics.fmean(s["metrics"]["format_curve"][-tenth:]) for s in seeds])
        entry |= {"local": config.local, "external": config.external, "adaptive": config.adaptive}
        out[config.name] = entry
    return out


# --- the study -------------------------------------------------------------------------------


def run_one(
    study: ExperimentSettings, base: NodeSettings, config: MixConfig, seed: int, progress=None, deadline: float | None = None
) -> dict[str, Any]:
    """One config x seed: build the nodes, run the rounds, write the run's raw.jsonl and metrics.

    Self-contained (every node seeds its own generators), so runs give the same result in any
    order and in any process. `progress(config, seed, round, reward)` is called after each round.
    """
    run_dir = out_dir_of(study, config, seed)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    run_started, cpu_started = time.perf_counter(), time.process_time()
    clock, hub, learners, solvers = build_run(base, study, config, seed, run_dir)
    setup_seconds, setup_cpu = time.perf_counter() - run_started, time.process_time() - cpu_started
    with (run_dir / "raw.jsonl").open("w") as raw:
        for r in range(1, study.rounds + 1):
            if deadline is not None and time.time() > deadline:
                log.warning("%s seed %d: --max-minutes reached after %d rounds", config.name, seed, r - 1)
                break
            rows = lockstep_round(r, clock, hub, learners, solvers)
            for row in rows:
                raw.write(json.dumps({"config": config.name, "seed": seed, **row}) + "\n")
            raw.flush()  # a long study can be inspected (or salvaged) while it runs
            if progress is not None:
                progress(config.name, seed, r, statistics.fmean(x["reward"] for x in rows))
    for learner in learners:
        learner.node.metrics.flush()
    seconds, cpu = time.perf_counter() - run_started, time.process_time() - cpu_started
    done = len(learners[0].records)
    return {
        "seed": seed,
        "rewards": [[r.reward_mean for r in l.records] for l in learners],
        "format_rates": [[r.format_rate for r in l.records] for l in learners],
        "external_groups_mean": _external_mean(learners),
        "balance_history": {l.index: l.node.balance.history for l in learners if l.node.balance},
        # CPU time too: on a shared machine it predicts an uncontended run better than wall time
        "seconds": {"setup": setup_seconds, "total": seconds,
                    "per_node_round": (seconds - setup_seconds) / (max(1, done) * study.nodes),
                    "cpu_per_node_round": (cpu - setup_cpu) / (max(1, done) * study.nodes)},
    }


def run_over_libp2p(
    study: ExperimentSettings, base: NodeSettings, node_flags: list[str], config: MixConfig, seed: int, progress=None
) -> dict[str, Any]:
    """One config x seed as a real swarm: `study.nodes` `sapo-node start` processes on 127.0.0.1,
    gossiping over libp2p with their own clocks (no lockstep), read back from their metrics."""
    import trio

    from sapo.node.swarm import run_swarm

    run_dir = out_dir_of(study, config, seed)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    flags = [*node_flags, "--local", str(config.local), "--external", str(config.external), "--rounds", str(study.rounds)]
    if study.format_discovery is not None and not any(f.startswith("--warm-start-tag-rate") for f in flags):
        flags += ["--warm-start-tag-rate", str(study.format_discovery)]
    if not any(f.startswith("--models-dir") for f in flags):
        flags += ["--models-dir", str(base.model.models_dir or study.out / "models")]
    started = time.perf_counter()
    failed = trio.run(run_swarm, study.nodes, run_dir, flags, base.run.seed + 1000 * seed, 30.0)
    if failed:
        raise RuntimeError(f"{config.name} seed {seed}: {failed} node(s) failed; see {run_dir}/node-*/node.log")
    rewards, formats, external = [], [], 0
    with (run_dir / "raw.jsonl").open("w") as raw:
        for k in range(study.nodes):
            records = [json.loads(line) for line in (run_dir / f"node-{k}" / "metrics.jsonl").read_text().splitlines()]
            rewards.append([r["reward_mean"] for r in records])
            formats.append([r["format_rate"] for r in records])
            external += sum(r["external_groups"] for r in records)
            for r in records:
                raw.write(json.dumps({
                    "config": config.name, "seed": seed, "node": k, "round": r["round"], "reward": r["reward_mean"],
                    "format_rate": r["format_rate"], "local_groups": r["local_groups"],
                    "external_groups": r["external_groups"], "accepted": r["accepted"], "rejected": r["rejected"],
                    "transport": "libp2p",
                }) + "\n")
    if progress is not None:
        for r in range(1, study.rounds + 1):
            progress(config.name, seed, r, statistics.fmean(curve[r - 1] for curve in rewards))
    records = sum(len(curve) for curve in rewards)
    seconds = time.perf_counter() - started
    return {
        "seed": seed,
        "rewards": rewards,
        "format_rates": formats,
        "external_groups_mean": external / records if records else 0.0,
        "balance_history": {},
        "seconds": {"setup": 0.0, "total": seconds, "per_node_round": seconds / max(1, records),
                    "cpu_per_node_round": None},
    }


def out_dir_of(study: ExperimentSettings, config: MixConfig, seed: int) -> Path:
    return study.out / "runs" / config.name.replace("/", "-") / f"seed-{seed}"


def job_count(study: ExperimentSettings, runs: int) -> int:
    return min(study.jobs or os.cpu_count() or 1, runs)


def _run_in_worker(study, base, config, seed, queue, deadline) -> dict[str, Any]:
    logging.basicConfig(level=base.run.log_level)
    return run_one(study, base, config, seed, progress=lambda *update: queue.put(update), deadline=deadline)


def _run_all(
    study: ExperimentSettings, base: NodeSettings, configs: list[MixConfig], progress, node_flags: list[str] | None
) -> dict[tuple[str, int], dict]:
    """Every run, in worker processes when --jobs > 1 (each run is one core's work)."""
    plan = [(config, seed) for seed in range(study.seeds) for config in configs]
    if study.transport == "libp2p":
        # each run is already a swarm of processes; run them one after another
        return {(c.name, s): run_over_libp2p(study, base, node_flags or [], c, s, progress) for c, s in plan}
    jobs = job_count(study, len(plan))
    deadline = time.time() + 60 * study.max_minutes if study.max_minutes else None
    if jobs == 1:
        return {(c.name, s): run_one(study, base, c, s, progress, deadline) for c, s in plan}
    import multiprocessing
    import queue as queue_module
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("spawn")  # no forked torch or tokenizer thread state
    with context.Manager() as manager, ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        updates = manager.Queue()
        futures = {pool.submit(_run_in_worker, study, base, c, s, updates, deadline): (c.name, s) for c, s in plan}
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            while True:
                try:
                    progress(*updates.get_nowait())
                except queue_module.Empty:
                    break
        return {futures[f]: f.result() for f in futures}


def run_experiment(study: ExperimentSettings, base: NodeSettings, node_flags: list[str] | None = None) -> dict[str, Any]:
    """Run every config x seed, write the outputs into study.out, and return summary.json's content.

    `node_flags` (the flags `base` was parsed from) are what libp2p runs pass to each node process."""
    from tqdm import tqdm

    configs = parse_configs(study.configs)
    out = study.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    bar = tqdm(total=len(configs) * study.seeds * study.rounds, file=sys.stderr, disable=not study.progress,
               unit="round", dynamic_ncols=True)

    def progress(config: str, seed: int, round_index: int, reward: float) -> None:
        bar.set_description(f"{config} seed {seed}")
        bar.set_postfix(round=round_index, reward=f"{reward:.3f}")
        bar.update(1)

    with bar:
        results = _run_all(study, base, configs, progress, node_flags)
    with (out / "raw.jsonl").open("w") as raw:
        for seed in range(study.seeds):
            for config in configs:
                raw.write((out_dir_of(study, config, seed) / "raw.jsonl").read_text())
    meta = {
        "round_visibility": "same round: all nodes generate and publish, then delivery, then mix and train"
        if study.transport == "memory" else "libp2p: each node on its own clock; what it received before mixing",
        "node_settings": base.flat(),
        "nodes": _node_table(base, study),
        "warm_start": _warm_start_recipe(base, study),
        "reasoning_gym": reasoning_gym_version(),
        "timing": {"wall_seconds": time.perf_counter() - started, "jobs": job_count(study, len(configs) * study.seeds)},
    }
    return write_outputs(study, configs, results, meta)


def write_outputs(study: ExperimentSettings, configs: list[MixConfig], results: dict[tuple[str, int], dict],
                  meta: dict[str, Any]) -> dict[str, Any]:
    """Metrics from each run's per-node curves, then summary.json, summary.md and curves.png.

    Under --max-minutes runs may stop at different rounds; every config is compared over the
    rounds all of them completed (raw.jsonl keeps every round).
    """
    rounds = min(len(r["rewards"][0]) for r in results.values())
    if rounds == 0:
        raise RuntimeError("--max-minutes ended the study before any run completed a round")
    window = ma_window(study, rounds)
    for result in results.values():
        rewards = [curve[:rounds] for curve in result.pop("rewards")]
        formats = [curve[:rounds] for curve in result.pop("format_rates")]
        result["metrics"] = curve_metrics(rewards, window)
        result["metrics"]["format_curve"] = [statistics.fmean(col) for col in zip(*formats)]
        result["format"] = spread_metrics(formats)
        result["accuracy"] = spread_metrics(rewards, threshold=SPREAD_REWARD)
    runs: dict[str, list[dict]] = {c.name: [results[(c.name, s)] for s in range(study.seeds)] for c in configs}
    timing = dict(meta["timing"]) | {"runs": {name: [s.get("seconds") for s in seeds] for name, seeds in runs.items()}}
    summary = {
        "definitions": METRIC_DEFINITIONS,
        "round_visibility": meta["round_visibility"],
        "study": study.model_dump(mode="json"),
        "node_settings": meta["node_settings"],
        "nodes": meta["nodes"],
        "warm_start": meta["warm_start"],
        "reasoning_gym": meta["reasoning_gym"],
        "results": summarize(configs, runs),
        "runs": {name: [{k: v for k, v in s.items() if k != "seconds"} for s in seeds] for name, seeds in runs.items()},
        "rounds_compared": rounds,
        "ma_window": window,
        "timing": timing,
    }
    out = study.out
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(render_markdown(summary, configs))
    plot_curves(runs, configs, out / "curves.png")
    return summary


def ma_window(study: ExperimentSettings, rounds: int) -> int:
    """The paper's 100-round window, shortened for short studies so the curve has a shape."""
    if study.ma_window:
        return min(study.ma_window, rounds)
    return min(MA_WINDOW, max(1, rounds // 3))


def resummarize(out: Path, ma_window_override: int | None = None) -> dict[str, Any]:
    """Recompute summary.json, summary.md and curves.png of a finished (or stopped) study from its
    raw.jsonl, with this version's metrics; the study's recorded settings are kept."""
    old = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None
    if old is None:
        raise FileNotFoundError(f"{out}/summary.json is missing; resummarize needs the study's recorded settings")
    study_fields = {k: v for k, v in old["study"].items() if k in ExperimentSettings.model_fields}
    study = ExperimentSettings(**(study_fields | {"out": out} | ({"ma_window": ma_window_override} if ma_window_override else {})))
    configs = parse_configs(study.configs)
    per_run: dict[tuple[str, int], dict[int, list[dict]]] = {}
    raw = out / "raw.jsonl"
    # committed results keep their raw rows gzipped
    text = raw.read_text() if raw.exists() else gzip.decompress((out / "raw.jsonl.gz").read_bytes()).decode()
    for line in text.splitlines():
        row = json.loads(line)
        per_run.setdefault((row["config"], row["seed"]), {}).setdefault(row["node"], []).append(row)
    old_runs = {(name, s["seed"]): s for name, seeds in old.get("runs", {}).items() for s in seeds}
    old_seconds = {(name, i): t for name, times in old.get("timing", {}).get("runs", {}).items() for i, t in enumerate(times)}
    results = {}
    for key, nodes in per_run.items():
        rows = [sorted(nodes[k], key=lambda r: r["round"]) for k in sorted(nodes)]
        everything = [r for node_rows in rows for r in node_rows]
        results[key] = {
            "seed": key[1],
            "rewards": [[r["reward"] for r in node_rows] for node_rows in rows],
            "format_rates": [[r["format_rate"] for r in node_rows] for node_rows in rows],
            "external_groups_mean": statistics.fmean(r["external_groups"] for r in everything),
            "balance_history": old_runs.get(key, {}).get("balance_history", {}),
            "seconds": old_seconds.get(key),
        }
    meta = {k: old[k] for k in ("round_visibility", "node_settings", "nodes", "warm_start", "reasoning_gym")}
    meta["timing"] = {k: v for k, v in old.get("timing", {}).items() if k != "runs"}
    return write_outputs(study, configs, results, meta)


def _external_mean(learners: list[Learner]) -> float:
    records = [r for l in learners for r in l.records]
    return sum(r.external_groups for r in records) / len(records) if records else 0.0


def _node_table(base: NodeSettings, study: ExperimentSettings) -> list[dict[str, Any]]:
    table = []
    for k in range(study.nodes):
        row = {"node": k, "role": "learner", "model": node_model(base, study, k)}
        if study.specialists:
            row["warm_start_tasks"] = [t.name for t in specialist_tasks(base.tasks.specs(), study.nodes, k)]
        table.append(row)
    table += [{"node": f"solver-{k}", "role": "scripted", "accuracy": study.solver_accuracy} for k in range(study.scripted_solvers)]
    return table


def _warm_start_recipe(base: NodeSettings, study: ExperimentSettings) -> dict[str, Any] | None:
    settings = base
    if study.format_discovery is not None:
        settings = base.model_copy(update={"model": base.model.model_copy(update={"warm_start_tag_rate": study.format_discovery})})
    recipe = warm_start_settings(settings)
    if recipe is None:
        return None
    return {"settings": recipe.model_dump(mode="json"), "tasks": "per node (specialists)" if study.specialists
            else [t.model_dump(mode="json") for t in base.tasks.specs()],
            "shared": "one per model source and task list, the same for every seed (like one pretrained checkpoint)"}


def _fmt(stat: dict[str, float] | None, digits: int = 3) -> str:
    if not stat:
        return "–"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def render_markdown(summary: dict[str, Any], configs: list[MixConfig]) -> str:
    study = summary["study"]
    lines = [
        "# SAPO I/J study",
        "",
        f"{study['nodes']} learning nodes, {summary['rounds_compared']} rounds"
        + (f" (of {study['rounds']} asked; --max-minutes {study['max_minutes']} ended the runs)"
           if summary["rounds_compared"] < study["rounds"] else "")
        + f", {study['seeds']} seed(s), model "
        f"{summary['node_settings']['model']}, tasks {', '.join(summary['node_settings']['tasks'])}, "
        f"sampler {summary['node_settings']['sampler']}. Round visibility: {summary['round_visibility']}.",
        "",
        "| config | cumulative reward | ÷ T/0 (matched batch) | ÷ I/0 (matched generation) | peak MA | oscillation | final MA |",
        "|---|---|---|---|---|---|---|",
    ]
    for config in configs:
        r = summary["results"][config.name]
        lines.append(
            f"| {config.name} | {_fmt(r['cumulative_reward'], 2)} | {_fmt(r.get('ratio_to_baseline'))} | "
            f"{_fmt(r.get('ratio_to_local_only'))} | {_fmt(r['peak_ma'])} | {_fmt(r['oscillation'], 5)} | {_fmt(r['final_ma'])} |"
        )
    lines += ["", "Values are mean ± std over seeds; ratios are paired per seed.", ""]
    lines += [
        "## How fast the format and the accuracy spread",
        "",
        f"Format rate: fraction of a node's local completions with an `<answer>` tag. Spread: the first round at "
        f"which a node's trailing {SPREAD_WINDOW}-round mean reaches the threshold (first node / every node; "
        "'–' = not reached), one value per seed.",
        "",
        "| config | format rate, first → last tenth | format ≥ {f}: first node | every node | reward ≥ {a}: first node | every node |".format(
            f=SPREAD_FORMAT, a=SPREAD_REWARD),
        "|---|---|---|---|---|---|",
    ]
    seeds_of = lambda values: ", ".join("–" if v is None else str(v) for v in values)  # noqa: E731
    for config in configs:
        r = summary["results"][config.name]
        spread = r["spread"]
        lines.append(
            f"| {config.name} | {_fmt(r['format_rate_start'], 2)} → {_fmt(r['format_rate_end'], 2)} | "
            f"{seeds_of(spread['format']['first_node_round'])} | {seeds_of(spread['format']['all_nodes_round'])} | "
            f"{seeds_of(spread['accuracy']['first_node_round'])} | {seeds_of(spread['accuracy']['all_nodes_round'])} |"
        )
    lines += ["", "## Definitions", ""]
    lines += [f"- **{k}**: {v}" for k, v in summary["definitions"].items()]
    heterogeneity = ("specialists", "mixed_sizes", "mixed_tokenizers", "scripted_solvers", "solver_accuracy", "format_discovery")
    flags = {k: study[k] for k in heterogeneity}
    lines += ["", "## Heterogeneity and warm start", "", f"- flags: `{json.dumps(flags)}`",
              f"- warm start: `{json.dumps(summary['warm_start'])}`", ""]
    return "\n".join(lines)


def plot_curves(runs: dict[str, list[dict]], configs: list[MixConfig], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, fax) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=120)
    for config in configs:
        seeds = runs[config.name]
        window = seeds[0]["metrics"]["ma_window"]
        label = "adaptive" if config.adaptive else f"{config.local} local / {config.external} external"
        curves = [s["metrics"]["ma_curve"] for s in seeds]
        # the format is found within tens of rounds: a short window keeps that visible
        format_window = min(window, FORMAT_WINDOW)
        formats = [moving_average(s["metrics"]["format_curve"], format_window) for s in seeds]
        for axis, family, start in ((ax, curves, window), (fax, formats, format_window)):
            mean = [statistics.fmean(col) for col in zip(*family)]
            x = list(range(start, start + len(mean)))
            (line,) = axis.plot(x, mean, label=label, linewidth=1.6, marker="o" if len(mean) < 3 else None)
            if len(family) > 1:
                std = [statistics.stdev(col) for col in zip(*family)]
                axis.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                                  color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_ylabel(f"average reward (moving average, window {window})")
    ax.set_title("SAPO: local/external mix")
    fax.set_ylabel(f"<answer> format rate (moving average, window {format_window})")
    fax.set_title("format discovery")
    for axis in (ax, fax):
        axis.set_xlabel("round")
        axis.grid(alpha=0.3)
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
