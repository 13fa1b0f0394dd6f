"""A node's receive path without a network, for tests of the intake: the real intake checks a
frame and stores nothing; `Receiver` then does what the exchange does with the verdict (keeps
an accepted group in the node's memory, charges a refusal to `penalize`), on the caller's
thread, and answers as the intake did before it returned verdicts: the group, or None."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sapo.node.core.counters import NodeCounters
from sapo.node.core.intake import Intake, node_intake
from sapo.node.core.memory import NodeMemory
from sapo.node.core.settings import NodeSettings
from sapo.protocol.wire.codec import DecodeLimits
from sapo.protocol.wire.verify import VerifyPolicy
from sapo.sampling.inbox import Inbox
from sapo.training.problems.rewards import score_group
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import reasoning_gym_version


def memory_of(inbox: Inbox, **intake: Any) -> NodeMemory:
    """A memory around `inbox`; `intake`: Intake's keywords (swarm, local_peer_id, ...), the rest
    defaulting as a test's would."""
    counters = intake.pop("counters", None) or NodeCounters()
    settings = {
        "rg_version": reasoning_gym_version(),
        "limits": DecodeLimits(),
        "policy": VerifyPolicy(),
        "max_group_bytes": inbox.max_bytes,
    } | intake
    return NodeMemory(inbox, Intake(counters, **settings), counters)


class Receiver:
    def __init__(self, memory: NodeMemory, penalize: Callable[[str, str], Any] | None = None):
        self.memory = memory
        self.intake = memory.intake
        self.inbox = memory.inbox
        self.counters = memory.counters
        self.penalize = penalize

    def accept(self, frame: bytes, signer: str, now: float) -> QuestionGroup | None:
        verdict = self.intake.accept(frame, signer, now)
        if verdict.refusal is not None and self.penalize is not None:
            self.penalize(signer, verdict.refusal)
        if verdict.group is not None:
            self.memory.store(verdict.group, now)
        return verdict.group

    def accept_logprobs(self, frame: bytes, signer: str, now: float) -> int:
        verdict = self.intake.accept_logprobs(frame, signer, now)
        if verdict.refusal is not None and self.penalize is not None:
            self.penalize(signer, verdict.refusal)
        return verdict.logprobs

    def to_json(self) -> dict:
        return self.intake.to_json()

    def restore(self, saved: dict) -> None:
        self.intake.restore(saved)


def memory_for(settings: NodeSettings, peer_id: str, inbox: Inbox) -> NodeMemory:
    """A memory around `inbox` whose intake is what `settings` make of it, as a node's is."""
    counters = NodeCounters()
    intake = node_intake(settings, counters, peer_id=peer_id, rg_version=reasoning_gym_version(), verifier=score_group)
    return NodeMemory(inbox, intake, counters)
