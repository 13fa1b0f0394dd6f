"""Turn a decoded RolloutGroup into a QuestionGroup this node can train on, trusting nothing.

The rule: a peer's answer key is accepted only if this node regenerates the same question and
answer from the spec, and rewards always come from this node's own verifier. The sender's
rewards and metadata are never used.

Scoring a group has a CPU budget (`SCORING_CPU_SECONDS` of this thread's time): the verifier's
answer caps bound one answer's cost, and a group that took more than any honest group could, with
whatever a future verifier does, is refused (`too_costly`) and its author charged.
"""

from __future__ import annotations

import gc
import threading
import time

from pydantic import BaseModel, ConfigDict, Field

from sapo.protocol.wire.allowlist import check_problem_spec
from sapo.protocol.wire.messages import Rejected, RejectReason, RolloutGroup
from sapo.training.problems.rewards import Verifier, score_group
from sapo.training.problems.rollouts import Behavior, QuestionGroup
from sapo.training.problems.tasks import Problem, generate_problem

# An honest group of 64 completions scores in about a millisecond (bench/hostile_answers.py): a
# hundred times that is no honest group's cost, and bounds what one group can take.
SCORING_CPU_SECONDS = 0.1


class _CollectorTime(threading.local):
    started = 0.0
    total = 0.0


_collector = _CollectorTime()


def _time_collections(phase: str, info: dict) -> None:
    if phase == "start":
        _collector.started = time.thread_time()
    else:
        _collector.total += time.thread_time() - _collector.started


gc.callbacks.append(_time_collections)


def work_seconds() -> float:
    """This thread's CPU time, less what it spent collecting garbage: a full collection of a
    node's heap takes about 200 ms, and must not be charged to whichever group it interrupted."""
    return time.thread_time() - _collector.total


class VerifyPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    accept_other_rg_versions: bool = Field(
        default=False,
        description=(
            "try to verify messages from peers on another reasoning-gym release; a generator "
            "change then shows up as spoofed_answer_key instead of unverifiable_version"
        ),
    )


def verify(
    msg: RolloutGroup, *, local_rg_version: str, policy: VerifyPolicy, verifier: Verifier = score_group
) -> QuestionGroup:
    """The message as a QuestionGroup with locally regenerated problem and rewards recomputed by
    this node's own `verifier`.

    Raises Rejected(unknown_dataset | config_out_of_range | unverifiable_version |
    spoofed_answer_key | too_costly).
    """
    check_problem_spec(msg.problem)
    if msg.reasoning_gym_version != local_rg_version and not policy.accept_other_rg_versions:
        raise Rejected(
            RejectReason.unverifiable_version,
            f"sender has reasoning-gym {msg.reasoning_gym_version[:40]!r}, this node {local_rg_version}",
        )
    try:
        problem = generate_problem(msg.problem.to_spec())
    except Exception as exc:  # noqa: BLE001 - a config the allowlist missed must not crash the node
        raise Rejected(
            RejectReason.config_out_of_range,
            f"{msg.problem.dataset} generator failed: {type(exc).__name__}: {str(exc)[:80]}",
        ) from None
    for name, ours, theirs in (("question", problem.question, msg.question), ("answer", problem.answer, msg.answer)):
        if ours != theirs:
            raise Rejected(RejectReason.spoofed_answer_key, f"{msg.problem.dataset}: {name} differs from the spec's")
    return QuestionGroup(
        problem=problem,
        completions=list(msg.completions),
        rewards=score_within_budget(verifier, problem, list(msg.completions), SCORING_CPU_SECONDS),
        origin=msg.sender,
        model_id=msg.model_id,
        sender_round=msg.sender_round,
        created_at=msg.created_at,
        behavior=Behavior(**msg.behavior.model_dump()) if msg.behavior is not None else None,
    )


def score_within_budget(
    verifier: Verifier, problem: Problem, completions: list[str], budget_seconds: float
) -> list[float]:
    """`verifier`'s rewards for `completions`, refused (`too_costly`) if they took more than
    `budget_seconds` of this thread's CPU. The verifier sees the whole group at once (some score a
    completion against its group); what one completion can cost is bounded by the verifier's own
    answer caps, so the group is refused after it is scored, not cut short."""
    started = work_seconds()
    rewards = verifier(problem, completions)
    spent = work_seconds() - started
    if spent > budget_seconds:
        raise Rejected(
            RejectReason.too_costly,
            f"{problem.spec.dataset}: {len(completions)} completions took {spent * 1000:.0f} ms of CPU to score, "
            f"over the budget of {budget_seconds * 1000:.0f} ms a group",
        )
    return rewards
