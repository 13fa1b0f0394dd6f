"""Running the controlled I/J study: every config x seed, in worker processes, each run either
in one process over the lockstep hub or as a real swarm of node processes over libp2p.

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
gives the same rows as a study that never stopped; STUDY_SETTINGS refuses other settings.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import trio

from sapo.node.core.flags import flag
from sapo.node.core.metrics import METRICS_FILE, RoundRecord
from sapo.node.core.round import RoundResult, run_round
from sapo.node.core.settings import NodeSettings, SettingsError
from sapo.node.study.nodes import RUN_STATE, Learner, StudyRun, build_run, read_run_state, remove_run_checkpoint
from sapo.node.study.run_timing import RunTiming, SegmentClock
from sapo.node.study.settings import ExperimentSettings, MixConfig, parse_configs
from sapo.node.study.summary import node_table, read_rows, warm_start_recipe, write_outputs
from sapo.training.tasks import reasoning_gym_version

log = logging.getLogger("sapo.experiment")

RUN_FINISHED = "run.json"  # in a run's dir once all its rounds are in its raw.jsonl: its timings
STUDY_SETTINGS = "study-settings.json"  # in --out: what its runs were made with
# Settings that change no run's rows: a study may go on under other values of these. A run's rows
# do not depend on how many seeds there are, so a study can also be extended by more seeds (not by
# more configs: the adaptive arm's I+J is the largest fixed arm's).
FREE_STUDY_FIELDS = {
    "out",
    "jobs",
    "progress",
    "max_minutes",
    "run_checkpoint_every",
    "resummarize",
    "ma_window",
    "seeds",
}
FREE_NODE_FIELDS = {"log_level"}


class StopSignal(Protocol):
    def is_set(self) -> bool: ...


class StudyStopped(Exception):
    """The study was asked to stop (Ctrl-C, SIGTERM): its runs checkpointed after their round."""


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
    failed = trio.run(run_swarm, study.nodes, run_dir, flags, base.run.seed + 1000 * seed, 30.0)
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


def job_count(study: ExperimentSettings, runs: int) -> int:
    return min(study.jobs or os.cpu_count() or 1, runs)


def _die_with_parent(parent: int) -> None:
    """A worker's initializer: on Linux, end this worker when the study's process dies, however
    it dies (a SIGKILL'd parent otherwise leaves its workers training for the rest of the run).
    Ctrl-C is the study's process's to handle: it asks the workers to stop after their round."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died while this worker was starting
            os._exit(1)


def _run_in_worker(study, base, config, seed, queue, deadline, stop) -> dict[str, Any]:
    from sapo.training.devices import configure_torch_threads

    logging.basicConfig(level=base.run.log_level)
    configure_torch_threads(base.model.torch_threads)
    return run_one(study, base, config, seed, lambda *update: queue.put(update), deadline, stop)


def _run_all(
    study: ExperimentSettings,
    base: NodeSettings,
    configs: list[MixConfig],
    progress,
    node_flags: list[str] | None,
    stop: threading.Event,
) -> dict[tuple[str, int], dict]:
    """Every run, in worker processes when --jobs > 1 (each run is one core's work); once `stop`
    is set, the runs under way stop after their round and the others do not start."""
    plan = [(config, seed) for seed in range(study.seeds) for config in configs]
    if study.transport == "libp2p":
        # each run is already a swarm of processes; run them one after another
        return {(c.name, s): run_over_libp2p(study, base, node_flags or [], c, s, progress) for c, s in plan}
    jobs = job_count(study, len(plan))
    deadline = time.time() + 60 * study.max_minutes if study.max_minutes else None
    if jobs == 1:
        return {(c.name, s): run_one(study, base, c, s, progress, deadline, stop) for c, s in plan if not stop.is_set()}
    import multiprocessing
    import queue as queue_module
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from multiprocessing.managers import SyncManager

    context = multiprocessing.get_context("spawn")  # no forked torch or tokenizer thread state
    manager = SyncManager(ctx=context)  # the progress queue's server, a process of its own
    manager.start(_die_with_parent, (os.getpid(),))
    with (
        manager,
        ProcessPoolExecutor(
            max_workers=jobs, mp_context=context, initializer=_die_with_parent, initargs=(os.getpid(),)
        ) as pool,
    ):
        updates, stopping = manager.Queue(), manager.Event()
        futures = {
            pool.submit(_run_in_worker, study, base, c, s, updates, deadline, stopping): (c.name, s) for c, s in plan
        }
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            if stop.is_set() and not stopping.is_set():
                stopping.set()
                for future in pending:
                    future.cancel()  # those not started yet
            while True:
                try:
                    progress(*updates.get_nowait())
                except queue_module.Empty:
                    break
        return {futures[f]: f.result() for f in futures if not f.cancelled()}


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Ctrl-C and SIGTERM set `stop` (the runs finish their round and checkpoint); a second Ctrl-C
    interrupts at once. Signal handlers belong to the main thread: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(number: int, frame) -> None:
        if stop.is_set() and number == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()
        log.warning("stopping: each run finishes its round and checkpoints (Ctrl-C again to stop at once)")

    previous = {number: signal.signal(number, handle) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def check_study_settings(study: ExperimentSettings, base: NodeSettings) -> None:
    """Record what the study in study.out is made with, or refuse to go on with other settings
    (its finished runs and checkpoints would then mix two studies). FREE_* fields may differ."""
    now = {
        "study": study.model_dump(mode="json", exclude=FREE_STUDY_FIELDS),
        "node": {k: v for k, v in base.flat().items() if k not in FREE_NODE_FIELDS},
    }
    path = study.out / STUDY_SETTINGS
    if not path.is_file():
        path.write_text(json.dumps(now, indent=1, sort_keys=True))
        return
    saved = json.loads(path.read_text())
    differences = [
        f"{flag(name)}: {saved[part].get(name, '(unset)')!r} before, {now[part].get(name, '(unset)')!r} now"
        for part in ("study", "node")
        for name in sorted(set(saved[part]) | set(now[part]))
        if saved[part].get(name, "(unset)") != now[part].get(name, "(unset)")
    ]
    if differences:
        raise SettingsError(
            f"{study.out} holds a study made with other settings, so it cannot go on with these:\n  "
            + "\n  ".join(differences)
            + f"\nRun the same command as before to continue it, or pass another --out (or delete {study.out}) "
            "to start a new study."
        )


def run_experiment(
    study: ExperimentSettings, base: NodeSettings, node_flags: list[str] | None = None
) -> dict[str, Any]:
    """Run every config x seed, write the outputs into study.out, and return summary.json's content.

    `node_flags` (the flags `base` was parsed from) are what libp2p runs pass to each node process."""
    from tqdm import tqdm

    configs = parse_configs(study.configs)
    out = study.out
    out.mkdir(parents=True, exist_ok=True)
    check_study_settings(study, base)
    started = time.perf_counter()
    done = (
        sum(rounds_done(study, c, s) for c in configs for s in range(study.seeds)) if study.transport == "memory" else 0
    )
    bar = tqdm(
        initial=done,  # a resumed study's bar starts from the rounds already done; its estimate counts only new ones
        total=len(configs) * study.seeds * study.rounds,
        file=sys.stderr,
        disable=not study.progress,
        unit="round",
        dynamic_ncols=True,
    )

    def progress(config: str, seed: int, round_index: int, accuracy: float) -> None:
        bar.set_description(f"{config} seed {seed}")
        bar.set_postfix(round=round_index, accuracy=f"{accuracy:.3f}")
        bar.update(1)

    stop = threading.Event()
    with bar, stop_on_signals(stop):
        seconds = _run_all(study, base, configs, progress, node_flags, stop)
    if stop.is_set():
        raise StudyStopped(
            f"stopped; every run under way checkpointed after its round. Run the same command again to continue {out}."
        )
    with (out / "raw.jsonl").open("w") as raw:
        for seed in range(study.seeds):
            for config in configs:
                raw.write((out_dir_of(study, config, seed) / "raw.jsonl").read_text())
    meta = {
        "round_visibility": "same round: all nodes generate and publish, then delivery, then mix and train"
        if study.transport == "memory"
        else "libp2p: each node on its own clock; what it received before mixing",
        "node_settings": base.flat(),
        "nodes": node_table(base, study),
        "warm_start": warm_start_recipe(base, study),
        "reasoning_gym": reasoning_gym_version(),
        "timing": {
            "wall_seconds": time.perf_counter() - started,
            "jobs": job_count(study, len(configs) * study.seeds),
            "runs": {f"{name} seed {seed}": times for (name, seed), times in seconds.items()},
        },
    }
    return write_outputs(study, configs, read_rows(out), meta)
