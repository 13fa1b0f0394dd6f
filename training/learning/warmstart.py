"""A short supervised pass on correct solutions: the CPU-scale stand-in for an instruct model.

Tiny from-scratch models barely learn by RL alone; a brief SFT on ReasoningGYM's own answers
(formatted as `<answer>…</answer>`) gives them a weak but non-zero start, like a small
pretrained model. The pass is deterministic for its settings, so it can be cached and recorded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel

from sapo.training.completions.scripted import wrong_answer
from sapo.training.models.policy import Policy, load_policy
from sapo.training.problems.tasks import TaskSampler, TaskSpec


class WarmStartSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(default=200, ge=0, le=100_000, description="supervised steps")
    batch_size: int = Field(default=16, ge=1, le=1024)
    lr: float = Field(default=1e-3, gt=0, lt=1)
    seed: int = Field(default=0, ge=0)
    tag_rate: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="fraction of targets written inside <answer> tags; below 1 the format is left to be discovered",
    )
    # Problems come from a dataset seed no node uses for its own questions.
    dataset_seed: int = Field(default=10_000_019, ge=0)
    answer_noise: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="fraction of targets whose answer is a near miss instead of the key: a model that is often "
        "unsure of what it mostly knows (its likeliest answer right, its samples often wrong)",
    )
    share: int = Field(default=0, ge=0, description="train only on questions in this share (a specialist)...")
    shares: int = Field(default=1, ge=1, description="...of this many, split by a hash of the question")


log = logging.getLogger("sapo.warmstart")


@dataclass(frozen=True)
class WarmStartReport:
    steps: int
    final_loss: float
    seconds: float


def question_share(question: str, shares: int) -> int:
    """Which of `shares` disjoint parts a question belongs to: the same on every machine."""
    return int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "big") % shares


def specialist_pool(sampler: TaskSampler, settings: WarmStartSettings, size: int = 512) -> list:
    """The questions of a specialist's share: up to `size` distinct ones, drawn once (drawing a
    batch afresh each step would generate `shares` times the problems it keeps)."""
    pool: dict[str, object] = {}
    for _ in range(size * settings.shares // 64 + 1):
        for problem in sampler.sample(64):
            if question_share(problem.question, settings.shares) == settings.share:
                pool.setdefault(problem.question, problem)
        if len(pool) >= size:
            break
    if not pool:
        raise ValueError(f"no question falls in warm-start share {settings.share} of {settings.shares}")
    return list(pool.values())


@dataclass(frozen=True)
class WarmStartProgress:
    """Where a warm start is, after `step` of `total` steps."""

    step: int
    total: int
    elapsed: float
    loss: float

    @property
    def seconds_left(self) -> float | None:
        return self.elapsed / self.step * (self.total - self.step) if self.step else None


# Who else follows the warm start besides the terminal (the daemon's status page). A context
# variable rather than an argument because the warm start runs deep inside the node's
# constructor; trio.to_thread.run_sync carries the caller's context into its worker thread.
# A watcher may raise to abandon the warm start (the daemon does on Ctrl-C); nothing is cached then.
_watcher: ContextVar[Callable[[WarmStartProgress], None] | None] = ContextVar("warm_start_watcher", default=None)

# Without a terminal (a log file), a progress line this often instead of a bar.
LOG_EVERY_SECONDS = 10.0


@contextmanager
def watching_warm_start(watcher: Callable[[WarmStartProgress], None]) -> Iterator[None]:
    """Call `watcher` after every warm-start step run inside this block (and in worker
    threads started from it)."""
    token = _watcher.set(watcher)
    try:
        yield
    finally:
        _watcher.reset(token)


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class _ProgressReport:
    """A tqdm bar on a terminal; in a log file, a line every LOG_EVERY_SECONDS instead of a
    bar's carriage returns. Either way with the time left, and the watcher after each step."""

    def __init__(self, total: int):
        from tqdm import tqdm

        self.total = total
        self.started = time.perf_counter()
        self.last_line = self.started
        self.watcher = _watcher.get()
        on_terminal = sys.stderr.isatty()
        self.bar = tqdm(
            total=total, desc="warm start", unit="step", file=sys.stderr, disable=not on_terminal, dynamic_ncols=True
        )

    def step(self, done: int, loss: float) -> None:
        now = time.perf_counter()
        progress = WarmStartProgress(done, self.total, now - self.started, loss)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        if self.bar.disable and (now - self.last_line >= LOG_EVERY_SECONDS or done == self.total):
            self.last_line = now
            left = progress.seconds_left
            log.info(
                "warm start: %d/%d steps, loss %.3f, %s",
                done,
                self.total,
                loss,
                "done" if done == self.total else f"about {_duration(left or 0)} left",
            )
        if self.watcher is not None:
            self.watcher(progress)

    def close(self) -> None:
        self.bar.close()


def solution_text(answer: str, tagged: bool = True) -> str:
    return f"<answer>{answer}</answer>" if tagged else answer


def warm_start(policy: Policy, tasks: list[TaskSpec], settings: WarmStartSettings) -> WarmStartReport:
    """Teacher-forced cross-entropy on completion tokens of correct solutions (a share of them
    wrong with --warm-start-answer-noise)."""
    started = time.perf_counter()
    torch.manual_seed(settings.seed)
    sampler = TaskSampler(tasks, dataset_seed=settings.dataset_seed, rng_seed=settings.seed)
    coin = random.Random(settings.seed)
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=settings.lr)
    pool = specialist_pool(sampler, settings) if settings.shares > 1 else None
    policy.model.train()
    loss = float("nan")
    progress = _ProgressReport(settings.steps)
    try:
        for step in range(1, settings.steps + 1):
            problems = (
                sampler.sample(settings.batch_size) if pool is None else coin.choices(pool, k=settings.batch_size)
            )
            loss = _supervised_step(policy, problems, coin, optimizer, settings)
            progress.step(step, loss)
    finally:
        progress.close()
        policy.model.eval()
    return WarmStartReport(settings.steps, loss, time.perf_counter() - started)


def _supervised_step(
    policy: Policy, problems: list, coin: random.Random, optimizer, settings: WarmStartSettings
) -> float:
    """One optimizer step on these problems' solutions; its loss."""
    tokenizer = policy.tokenizer
    rows = []
    for problem in problems:
        prompt = tokenizer(policy.prompt(problem), add_special_tokens=False)["input_ids"]
        tagged = coin.random() < settings.tag_rate
        # Without noise, draw nothing: the coin's stream (and so every noise-free warm start) stays
        # what it was before answer noise existed.
        noisy = settings.answer_noise > 0 and coin.random() < settings.answer_noise
        answer = wrong_answer(problem.answer, coin) if noisy else problem.answer
        target = tokenizer(solution_text(answer, tagged), add_special_tokens=False)["input_ids"]
        rows.append((prompt, target + [tokenizer.eos_token_id]))
    length = max(len(p) + len(t) for p, t in rows)
    ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    for i, (prompt, target) in enumerate(rows):
        seq = prompt + target
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(prompt) : len(seq)] = torch.tensor(target)
        attention[i, : len(seq)] = 1
    device = policy.device
    out = policy.model(input_ids=ids.to(device), attention_mask=attention.to(device), labels=labels.to(device))
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
    optimizer.step()
    return float(out.loss.detach())


def warm_start_key(source: str, model_seed: int, tasks: list[TaskSpec], settings: WarmStartSettings) -> str:
    """What the warm start depends on; equal keys give identical weights."""
    recipe = {
        "source": source,
        "model_seed": model_seed,
        "tasks": [t.model_dump(mode="json") for t in tasks],
        "settings": settings.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def cached_warm_start(
    source: str, *, model_seed: int, tasks: list[TaskSpec], settings: WarmStartSettings, models_dir: Path, device: str
) -> Path:
    """The HF directory of `source` after its warm start, built once and reused.

    The directory name is the recipe's hash; a `recipe.json` written last marks it complete,
    and it is renamed into place, so crashes never leave half a warm start. Nodes of a local
    swarm share the cache: a file lock makes the others wait for the first instead of
    repeating its work.
    """
    import fcntl

    key = warm_start_key(source, model_seed, tasks, settings)
    # `source` may be a path such as ../../x: keep only a readable, separator-free stem of it,
    # so the cache entry always lands inside models_dir/warmstart (the key tells them apart).
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", source).strip("_")[-48:] or "model"
    final = models_dir / "warmstart" / f"{stem}-{key}"
    if (final / "recipe.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "recipe.json").is_file():
            return final
        return _build_warm_start(source, model_seed, tasks, settings, models_dir, device, final)


def _build_warm_start(
    source: str,
    model_seed: int,
    tasks: list[TaskSpec],
    settings: WarmStartSettings,
    models_dir: Path,
    device: str,
    final: Path,
) -> Path:
    policy = load_policy(source, device=device, seed=model_seed, models_dir=models_dir, prompt_style="auto")
    log.info(
        "warm start of %s: %d supervised steps on %d task(s), once; cached in %s",
        source,
        settings.steps,
        len(tasks),
        final.parent,
    )
    report = warm_start(policy, tasks, settings)
    log.info(
        "warm start of %s: %d steps, final loss %.3f, %.1fs", source, report.steps, report.final_loss, report.seconds
    )
    partial = final.parent / f".partial-{final.name}-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    if not isinstance(policy.model, PreTrainedModel):  # a policy loaded without LoRA is one
        raise TypeError(f"a warm start saves a transformers model, not a {type(policy.model).__name__}")
    policy.model.save_pretrained(partial)
    policy.tokenizer.save_pretrained(partial)
    recipe = {
        "source": source,
        "model_seed": model_seed,
        "tasks": [t.model_dump(mode="json") for t in tasks],
        "settings": settings.model_dump(mode="json"),
        "final_loss": report.final_loss,
        "seconds": report.seconds,
    }
    (partial / "recipe.json").write_text(json.dumps(recipe, indent=1))
    shutil.rmtree(final, ignore_errors=True)  # an incomplete one (no recipe.json) from a crash
    os.rename(partial, final)
    return final
