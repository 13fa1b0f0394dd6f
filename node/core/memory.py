"""A node's memory of its peers: the inbox with its authors' standing, the intake's memories
(what each author had verified, its verification budget, log-probs waiting for their group) and
the counters. `NodeState` is where the node's rounds stand; this is what it has learnt of the
swarm. Both are saved in the node's checkpoint and restored from it, by the daemon and the study
through the same code, so a node that restarts (or is killed and restarted) still refuses what it
refused, still weighs authors as they earned, and still trains on what was waiting for it.

It is bounded because each part is: the inbox by its caps, standing by its author bound, the
intake's memories by author and age, the counters by their peer bound.

`store` is the one write of an accepted group: the exchange calls it on the trio thread after
the intake (in a worker thread) has checked the group and stored nothing, with the group's
provenance (whether this node asked for it, where its author's connection comes from): only a
group it asked for earns its author standing (sampling/standing.py).

Saved memories are versioned: this release writes `MEMORY_VERSION` and reads every version in
`READABLE_VERSIONS` (version 1 held standing as 0.4.x counted it, taken over by
`Standing.restore`), so a node left alone for months still starts with what it knew.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sapo.node.core.counters import NodeCounters
from sapo.node.core.intake import Intake
from sapo.sampling.inbox import Inbox
from sapo.sampling.standing import ASKED, Provenance
from sapo.training.learning.grpo import has_signal
from sapo.training.problems.rollouts import QuestionGroup

log = logging.getLogger("sapo.node")

MEMORY_VERSION = 2
READABLE_VERSIONS = (1, 2)


@dataclass
class NodeMemory:
    inbox: Inbox  # with its authors' standing
    intake: Intake
    counters: NodeCounters

    def store(self, group: QuestionGroup, now: float, provenance: Provenance = ASKED) -> None:
        """Keep a group the intake accepted. Its author earns standing if this node asked for it
        and it carries signal, and is placed where its connection comes from (its network
        group, if known), so that keys behind one address share one budget. Credited first, so
        that the inbox makes room by the author's standing as of this group."""
        if has_signal(group.rewards):
            self.inbox.standing.credit(group.origin, now, provenance)
        self.inbox.add(group, now)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": MEMORY_VERSION,
            "inbox": self.inbox.to_json(),
            "intake": self.intake.to_json(),
            "counters": self.counters.to_json(),
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Take what `to_json` saved into this memory, built from the same settings and empty."""
        if saved.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"saved memory version {saved.get('version')!r}, this node reads {READABLE_VERSIONS}")
        self.inbox.restore(saved["inbox"])
        self.intake.restore(saved["intake"])
        self.counters.restore(saved["counters"])

    def describe(self) -> str:
        return (
            f"{len(self.inbox)} groups waiting, "
            f"{len(self.inbox.standing)} authors' standing, "
            f"{self.intake.remembered()} verified frames remembered"
        )
