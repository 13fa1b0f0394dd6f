"""A node's memory of its peers: the inbox with its authors' standing, the intake's memories
(what each author had verified, its verification budget, log-probs waiting for their group) and
the counters. `NodeState` is where the node's rounds stand; this is what it has learnt of the
swarm. Both are saved in the node's checkpoint and restored from it, by the daemon and the study
through the same code, so a node that restarts (or is killed and restarted) still refuses what it
refused, still weighs authors as they earned, and still trains on what was waiting for it.

It is bounded because each part is: the inbox by its caps, standing by its author bound, the
intake's memories by author and age, the counters by their peer bound.

`store` is the one write of an accepted group: the exchange calls it on the trio thread after
the intake (in a worker thread) has checked the group and stored nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sapo.node.core.counters import NodeCounters
from sapo.node.core.intake import Intake
from sapo.sampling.inbox import Inbox
from sapo.training.problems.rollouts import QuestionGroup

log = logging.getLogger("sapo.node")

MEMORY_VERSION = 1


@dataclass
class NodeMemory:
    inbox: Inbox  # with its authors' standing
    intake: Intake
    counters: NodeCounters

    def store(self, group: QuestionGroup, now: float, place: str | None = None) -> None:
        """Keep a group the intake accepted (its author earns standing if it carries signal), and
        where its author's connection comes from (`place`, its network address group, if
        directly connected), so that keys behind one address share one standing."""
        self.inbox.add(group, now)
        self.inbox.standing.locate(group.origin, place)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": MEMORY_VERSION,
            "inbox": self.inbox.to_json(),
            "intake": self.intake.to_json(),
            "counters": self.counters.to_json(),
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Take what `to_json` saved into this memory, built from the same settings and empty."""
        if saved.get("version") != MEMORY_VERSION:
            raise ValueError(f"saved memory version {saved.get('version')!r}, this node reads {MEMORY_VERSION}")
        self.inbox.restore(saved["inbox"])
        self.intake.restore(saved["intake"])
        self.counters.restore(saved["counters"])

    def describe(self) -> str:
        return (
            f"{len(self.inbox)} groups waiting, "
            f"{len(self.inbox.standing.to_json())} authors' standing, "
            f"{self.intake.remembered()} verified frames remembered"
        )
