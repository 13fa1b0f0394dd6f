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
- MA curve: the trailing moving average, window w = min(100, rounds), of the node-averaged
  reward; peak = its maximum; oscillation = mean |MA(t+1) - MA(t)| after the peak (0 if the peak
  is the last point).
Scripted solvers are peers, not learners: they are excluded from every metric.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
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
from sapo.sampling.balance import AdaptiveBalance
from sapo.training.generation import GenerationResult
from sapo.training.scripted import ScriptedSolver
from sapo.training.tasks import TaskSampler, TaskSpec, reasoning_gym_version

log = logging.getLogger("sapo.experiment")

SIZE_CYCLE = ("tiny-small", "tiny", "tiny-large")
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
            "sampling": base.sampling.model_copy(update={"local": config.local, "external": config.external}),
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
    balance: AdaptiveBalance | None
    rewards: list[float] = field(default_factory=list)


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
        balance = AdaptiveBalance(total=config.total, external=config.external) if config.adaptive else None
        learners.append(Learner(k, node, exchange, balance))
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
        local, external = learner.balance.split(round_index) if learner.balance else (None, None)
        started = time.perf_counter()
        generation = learner.node.generate(round_index, count=local)
        learner.exchange.publish(generation.groups, round_index)
        generations.append((generation, external, time.perf_counter() - started))
    for peer in solvers:
        generation = peer.solver.generate_groups(peer.tasks.sample(peer.local), peer.generations, round_index)
        peer.exchange.publish(generation.groups, round_index)
    hub.deliver()
    rows = []
    for learner, (generation, external, seconds) in zip(learners, generations):
        node = learner.node
        started = time.perf_counter()
        training_set = node.mix(generation, external_count=external, now=clock())
        update = node.train(training_set)
        seconds += time.perf_counter() - started
        record = node.record(round_index, generation, training_set, update, seconds, learner.exchange.peers())
        if learner.balance is not None and learner.rewards:
            learner.balance.observe(round_index - 1, record.reward_mean - learner.rewards[-1])
        learner.rewards.append(record.reward_mean)
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


def curve_metrics(per_node_rewards: list[list[float]]) -> dict[str, Any]:
    rounds = len(per_node_rewards[0])
    mean_curve = [sum(col) / len(col) for col in zip(*per_node_rewards)]
    window = min(MA_WINDOW, rounds)
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
        entry |= {"local": config.local, "external": config.external, "adaptive": config.adaptive}
        out[config.name] = entry
    return out


# --- the study -------------------------------------------------------------------------------


def run_experiment(study: ExperimentSettings, base: NodeSettings) -> dict[str, Any]:
    """Run every config x seed, write the outputs into study.out, and return summary.json's content."""
    from tqdm import tqdm

    configs = parse_configs(study.configs)
    out = study.out
    out.mkdir(parents=True, exist_ok=True)
    raw_path = out / "raw.jsonl"
    raw_path.write_text("")
    runs: dict[str, list[dict]] = {c.name: [] for c in configs}
    started = time.perf_counter()
    bar = tqdm(total=len(configs) * study.seeds * study.rounds, file=sys.stderr, disable=not study.progress,
               unit="round", dynamic_ncols=True)
    with bar, raw_path.open("a") as raw:
        for seed in range(study.seeds):
            for config in configs:
                bar.set_description(f"{config.name} seed {seed}")
                run_dir = out / "runs" / config.name.replace("/", "-") / f"seed-{seed}"
                shutil.rmtree(run_dir, ignore_errors=True)
                run_started, cpu_started = time.perf_counter(), time.process_time()
                clock, hub, learners, solvers = build_run(base, study, config, seed, run_dir)
                setup_seconds, setup_cpu = time.perf_counter() - run_started, time.process_time() - cpu_started
                for r in range(1, study.rounds + 1):
                    rows = lockstep_round(r, clock, hub, learners, solvers)
                    for row in rows:
                        raw.write(json.dumps({"config": config.name, "seed": seed, **row}) + "\n")
                    raw.flush()  # a long study can be inspected (or salvaged) while it runs
                    bar.set_postfix(round=r, reward=f"{statistics.fmean(x['reward'] for x in rows):.3f}")
                    bar.update(1)
                for learner in learners:
                    learner.node.metrics.flush()
                seconds, cpu = time.perf_counter() - run_started, time.process_time() - cpu_started
                runs[config.name].append(
                    {
                        "seed": seed,
                        "metrics": curve_metrics([l.rewards for l in learners]),
                        "external_groups_mean": _external_mean(learners),
                        "balance_history": {l.index: l.balance.history for l in learners if l.balance},
                        # CPU time too: on a shared machine it predicts an uncontended run better than wall time
                        "seconds": {"setup": setup_seconds, "total": seconds,
                                    "per_node_round": (seconds - setup_seconds) / (study.rounds * study.nodes),
                                    "cpu_per_node_round": (cpu - setup_cpu) / (study.rounds * study.nodes)},
                    }
                )
    summary = {
        "definitions": METRIC_DEFINITIONS,
        "round_visibility": "same round: all nodes generate and publish, then delivery, then mix and train",
        "study": study.model_dump(mode="json"),
        "node_settings": base.flat(),
        "nodes": _node_table(base, study),
        "warm_start": _warm_start_recipe(base, study),
        "reasoning_gym": reasoning_gym_version(),
        "results": summarize(configs, runs),
        "runs": {name: [{k: v for k, v in s.items() if k != "seconds"} for s in seeds] for name, seeds in runs.items()},
        "timing": {"wall_seconds": time.perf_counter() - started,
                   "runs": {name: [s["seconds"] for s in seeds] for name, seeds in runs.items()}},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(render_markdown(summary, configs))
    plot_curves(runs, configs, out / "curves.png")
    return summary


def _external_mean(learners: list[Learner]) -> float:
    records = [r for l in learners for r in l.node.metrics.records]
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
        f"{study['nodes']} learning nodes, {study['rounds']} rounds, {study['seeds']} seed(s), model "
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
    lines += ["", "Values are mean ± std over seeds; ratios are paired per seed.", "", "## Definitions", ""]
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

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for config in configs:
        curves = [s["metrics"]["ma_curve"] for s in runs[config.name]]
        window = runs[config.name][0]["metrics"]["ma_window"]
        mean = [statistics.fmean(col) for col in zip(*curves)]
        x = list(range(window, window + len(mean)))
        label = "adaptive" if config.adaptive else f"{config.local} local / {config.external} external"
        (line,) = ax.plot(x, mean, label=label, linewidth=1.6, marker="o" if len(mean) < 3 else None)
        if len(curves) > 1:
            std = [statistics.stdev(col) for col in zip(*curves)]
            ax.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xlabel("round")
    ax.set_ylabel(f"average reward (moving average, window {window})")
    ax.set_title("SAPO: local/external mix")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
