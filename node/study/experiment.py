"""`sapo-node experiment`: every config x seed of the study (runs.py runs one), in worker
processes when --jobs > 1, stopped cleanly by Ctrl-C or SIGTERM, then the study's outputs
(summary.py). A study's --out records the settings it was made with, and a study goes on only
under the same ones (FREE_* aside), so that its finished runs and checkpoints never mix two."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sapo.node.core.settings import NodeSettings, SettingsError
from sapo.node.flags import flag
from sapo.node.study.runs import out_dir_of, rounds_done, run_one, run_over_libp2p
from sapo.node.study.settings import ExperimentSettings, MixConfig, parse_configs
from sapo.node.study.summary import node_table, read_rows, warm_start_recipe, write_outputs
from sapo.training.problems.tasks import reasoning_gym_version

log = logging.getLogger("sapo.experiment")

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


class StudyStopped(Exception):
    """The study was asked to stop (Ctrl-C, SIGTERM): its runs checkpointed after their round."""


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
    from sapo.training.models.devices import configure_torch_threads

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
