"""The warm start reports its progress (a bar on a terminal, log lines in a file, a watcher
for the daemon's page), and a watcher can stop it without leaving a cache entry behind."""

import logging

import pytest

from sapo.training.learning.warmstart import (
    WarmStartSettings,
    cached_warm_start,
    warm_start,
    watching_warm_start,
)
from sapo.training.models.policy import load_policy
from sapo.training.problems.tasks import default_task_specs

TASKS = default_task_specs(["basic_arithmetic"])


def tiny_policy(tmp_path):
    return load_policy("tiny", device="cpu", seed=0, models_dir=tmp_path, prompt_style="auto")


def test_watcher_sees_every_step_with_the_time_left_and_the_log_says_when_done(tmp_path, caplog):
    seen = []
    with caplog.at_level(logging.INFO, logger="sapo.warmstart"), watching_warm_start(seen.append):
        report = warm_start(tiny_policy(tmp_path), TASKS, WarmStartSettings(steps=4, batch_size=4))
    assert [p.step for p in seen] == [1, 2, 3, 4] and {p.total for p in seen} == {4}
    assert all(p.elapsed > 0 for p in seen) and seen[-1].seconds_left == 0
    assert seen[0].seconds_left == pytest.approx(seen[0].elapsed * 3)
    assert report.final_loss == seen[-1].loss
    # pytest's stderr is no terminal: no bar, a log line instead (at the end at least)
    assert "warm start: 4/4 steps" in caplog.text and "done" in caplog.text


def test_outside_a_watching_block_nobody_is_called(tmp_path):
    calls = []
    with watching_warm_start(calls.append):
        pass
    warm_start(tiny_policy(tmp_path), TASKS, WarmStartSettings(steps=2, batch_size=2))
    assert calls == []


def test_a_watcher_that_raises_stops_the_warm_start_and_nothing_is_cached(tmp_path):
    class Stop(Exception):
        pass

    def stop_at_two(progress):
        if progress.step == 2:
            raise Stop

    with pytest.raises(Stop), watching_warm_start(stop_at_two):
        cached_warm_start(
            "tiny",
            model_seed=0,
            tasks=TASKS,
            settings=WarmStartSettings(steps=50, batch_size=2),
            models_dir=tmp_path,
            device="cpu",
        )
    assert not list((tmp_path / "warmstart").glob("*/recipe.json"))
