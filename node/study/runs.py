"""One run of the controlled I/J study (one config x seed), either in one process over the
lockstep hub or as a real swarm of node processes over libp2p; experiment.py runs them all.

Each node is the daemon's own `Node` and each round the daemon's own `run_round`, and every
shared group goes through `GroupEncoder.frame` -> codec -> `Intake.accept` (decode, checks,
regeneration, re-scoring) -> the receiver's inbox, so the study exercises the real wire path.

Round visibility (in-memory): within round r every node generates and publishes its local
groups; the hub delivers them once all have published; then each node mixes and trains. So
node k's round-r groups are visible to the others *in the same round r*, as in the paper's
controlled run. Time is a round clock (round r happens at T0 + r * round_seconds, default
1000 s), so with the default inbox max age (600 s) only the current round's groups are
eligible; pass a larger --inbox-max-age-seconds to let older groups stay eligible. Over libp2p
every node runs on its own clock, as a deployed node does.

Resuming (in-memory runs): a run checkpoints itself every --run-checkpoint-every rounds and when
stopped (Ctrl-C or SIGTERM: the round in progress finishes first; --max-minutes), and marks
itself finished (RUN_FINISHED) at the end. The same command with the same --out then skips the
finished runs, resumes the others from their checkpoints (their raw.jsonl cut back to it) and
gives the same rows as a study that never stopped (experiment.py refuses other settings).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import trio

from sapo.node.core.metrics import METRICS_FILE, RoundRecord
from sapo.node.core.round import RoundResult, run_round
from sapo.node.core.settings import NodeSettings
from sapo.node.study.nodes import (
    RUN_STATE,
    Learner,
    StudyRun,
    base_seed,
    build_run,
    read_run_state,
    remove_run_checkpoint,
)
from sapo.node.study.run_timing import RunTiming, SegmentClock
from sapo.node.study.settings import ExperimentSettings, MixConfig

log = logging.getLogger("sapo.experiment")

RUN_FINISHED = "run.json"  # in a run's dir once all its rounds are in its raw.jsonl: its timings


class StopSignal(Protocol):
    def is_set(self) -> bool: ...


def run_one(
    study: ExperimentSettings,
    base: NodeSettings,
    config: MixConfig,
    seed: int,
    progress=None,
    deadline: float | None = None,
    stop: StopSignal | None = None,
) -> dict[str, Any]:
    """One config x seed: build the nodes, run the rounds, write the run's raw.jsonl and metrics.

    Self-contained (every node seeds its own generators), so runs give the same result in any
    order and in any process. `progress(config, seed, round, reward)` is called after each round.
    A finished run is not run again; one with a checkpoint goes on from it. The run stops early,
    checkpointing, once `stop` is set or at `deadline`.
    """
    run_dir = out_dir_of(study, config, seed)
    if (run_dir / RUN_FINISHED).is_file():
        return json.loads((run_dir / RUN_FINISHED).read_text())
    saved = read_run_state(run_dir)
    if saved is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
    segment = SegmentClock()
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()  # a bar per node checkpoint would break the study's own
    run = build_run(base, study, config, seed, run_dir)
    first, before = 1, RunTiming()
    if saved is not None:
        run.restore(saved)
        first = saved["round"] + 1
        # a checkpoint written before runs were timed across segments has none: its rounds go untimed
        before = RunTiming.model_validate(saved.get("timing", {}))
        keep_rows_through(run_dir / "raw.jsonl", saved["round"])
        log.info("%s seed %d: resumed after round %d", config.name, seed, saved["round"])
    segment.set_up()
    every = study.run_checkpoint_every
    with (run_dir / "raw.jsonl").open("a") as raw:

        def checkpoint() -> None:
            os.fsync(raw.fileno())  # the rows a checkpoint stands on are on disk before it
            run.checkpoint(run_dir, before.plus(segment.so_far(run.clock.round - first + 1)).model_dump())

        def write_round(round_index: int, results: list[RoundResult | None]) -> None:
            rows = [
                round_row(config, seed, learner.index, learner.node.settings.model.model, result.record)
                | ({"joined": learner.joins_at} if learner.joins_at > 1 else {})
                for learner, result in zip(run.learners, results)
                if result is not None
            ]
            raw.writelines(json.dumps(row) + "\n" for row in rows)
            raw.flush()  # a long study can be inspected (or salvaged) while it runs
            if every and round_index % every == 0 and round_index < study.rounds:
                checkpoint()
            if progress is not None:
                progress(config.name, seed, round_index, statistics.fmean(row["accuracy"] for row in rows))

        def stopping() -> bool:
            return (stop is not None and stop.is_set()) or (deadline is not None and time.time() > deadline)

        done = trio.run(run_lockstep, run, study.rounds, stopping, write_round, first)
        ran = done - first + 1
        if done < study.rounds and every and ran and done % every:  # stopped since its last checkpoint
            checkpoint()
    if done < study.rounds:
        log.warning("%s seed %d: stopped after round %d of %d", config.name, seed, done, study.rounds)
    for learner in run.learners:
        learner.records.flush()
    times = before.plus(segment.so_far(ran)).report(study.nodes)
    if done == study.rounds:
        (run_dir / RUN_FINISHED).write_text(json.dumps(times))
        remove_run_checkpoint(run_dir)
    return times


def keep_rows_through(raw: Path, round_index: int) -> None:
    """Cut a resumed run's raw.jsonl back to its checkpoint's round (a crash may have left rows
    of later rounds, even half a row)."""
    if not raw.is_file():
        return
    kept = []
    for line in raw.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row["round"] <= round_index:
            kept.append(line + "\n")
    raw.write_text("".join(kept))


def rounds_done(study: ExperimentSettings, config: MixConfig, seed: int) -> int:
    """A run's rounds already in its raw.jsonl for good: all once it finished, else up to its checkpoint."""
    run_dir = out_dir_of(study, config, seed)
    if (run_dir / RUN_FINISHED).is_file():
        return study.rounds
    if (run_dir / RUN_STATE).is_file():
        return int(json.loads((run_dir / RUN_STATE).read_text())["round"])
    return 0


async def run_lockstep(
    run: StudyRun, rounds: int, stopping: Callable[[], bool] | None, on_round, first: int = 1
) -> int:
    """The run's rounds from `first`, each one `run_round` per learner (the daemon's own round)
    over the lockstep hub, plus the scripted peers' publishing, until `rounds` or until
    `stopping()` says so before a round; returns the last round done. A late joiner's round runs
    from its join round on (`on_round` gets None for it before).

    One torch lock for all nodes: their torch work takes turns on the one core a run gets.
    """
    torch_lock = trio.Lock()
    for round_index in range(first, rounds + 1):
        if stopping is not None and stopping():
            return round_index - 1
        run.clock.round = round_index
        results: list[RoundResult | None] = [None] * len(run.learners)

        async def learner_round(position: int, learner: Learner) -> None:
            result = await run_round(learner.node, learner.state, learner.exchange, torch_lock, run.clock, run.generate)
            learner.state, results[position] = result.state, result

        async with trio.open_nursery() as nursery:
            for position, learner in enumerate(run.learners):
                if learner.joins_at <= round_index:
                    nursery.start_soon(learner_round, position, learner)
            for peer in run.solvers:
                nursery.start_soon(peer.round, round_index)
        on_round(round_index, results)
    return rounds


def round_row(config: MixConfig, seed: int, node: int, model: str, record: RoundRecord) -> dict[str, Any]:
    """One node-round of raw.jsonl: what the study's metrics are computed from."""
    return {
        "config": config.name,
        "seed": seed,
        "node": node,
        "model": model,
        "round": record.round,
        "reward": record.reward_mean,
        "accuracy": record.accuracy,
        "format_rate": record.format_rate,
        "heldout": record.heldout,
        "heldout_sampled": record.heldout_sampled,
        "asked": record.asked,
        "local_groups": record.local_groups,
        "external_groups": record.external_groups,
        "external_planned": record.external_planned,
        "external_reward_mean": record.external_reward_mean,
        "inbox_size": record.inbox_size,
        "accepted": record.accepted,
        "rejected": record.rejected,
        "loss": record.loss,
        "generated_tokens": record.generated_tokens,
        "augment_tokens": record.augment_tokens,
        "update_tokens": record.update_tokens,
        "generate_seconds": record.generate_seconds,
        "train_seconds": record.train_seconds,
        # the node's own work; its round in the lockstep also waits for the others to publish
        "round_seconds": record.generate_seconds + record.train_seconds,
    }


def run_over_libp2p(
    study: ExperimentSettings, base: NodeSettings, node_flags: list[str], config: MixConfig, seed: int, progress=None
) -> dict[str, Any]:
    """One config x seed as a real swarm: `study.nodes` `sapo-node start` processes on 127.0.0.1,
    gossiping over libp2p with their own clocks (no lockstep), read back from their metrics."""
    from sapo.node.swarm import run_swarm

    run_dir = out_dir_of(study, config, seed)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    flags = [*node_flags, "--rounds", str(study.rounds), *config.node_flags()]
    flags += ["--draw-questions", str(study.questions_per_round)]  # matched questions, as in-memory runs
    if study.format_discovery is not None and not any(f.startswith("--warm-start-tag-rate") for f in flags):
        flags += ["--warm-start-tag-rate", str(study.format_discovery)]
    if not any(f.startswith("--models-dir") for f in flags):
        flags += ["--models-dir", str(base.model.models_dir or study.out / "models")]
    started = time.perf_counter()
    failed = trio.run(run_swarm, study.nodes, run_dir, flags, base_seed(base) + 1000 * seed, 30.0)
    if failed:
        raise RuntimeError(f"{config.name} seed {seed}: {failed} node(s) failed; see {run_dir}/node-*/node.log")
    with (run_dir / "raw.jsonl").open("w") as raw:
        for k in range(study.nodes):
            with (run_dir / f"node-{k}" / METRICS_FILE).open() as lines:  # a line at a time, however long the run
                for line in lines:
                    row = round_row(config, seed, k, base.model.model, RoundRecord.model_validate_json(line))
                    raw.write(json.dumps(row | {"transport": "libp2p"}) + "\n")
    if progress is not None:
        for r in range(1, study.rounds + 1):
            progress(config.name, seed, r, float("nan"))
    seconds = time.perf_counter() - started
    return {
        "setup": 0.0,
        "total": seconds,
        "per_node_round": seconds / max(1, study.rounds * study.nodes),
        "cpu_per_node_round": None,
    }


def out_dir_of(study: ExperimentSettings, config: MixConfig, seed: int) -> Path:
    return study.out / "runs" / config.name.replace("/", "-") / f"seed-{seed}"
