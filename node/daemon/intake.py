"""The receive path: frame -> decoded message -> checks -> verified group -> inbox.

Every refusal has a named reason, counted per reason; nothing a peer sends can raise past here.
Each refusal is also reported to `on_reject(signer, reason)`, which the daemon wires to the
gossip layer's peer score, so a peer that keeps sending junk ends up banned.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from typing import Callable

from sapo.node.daemon.counters import NodeCounters
from sapo.node.daemon.refusal_log import RefusalLog
from sapo.protocol.codec import DecodeLimits, canonical_json, decode
from sapo.protocol.messages import Rejected, RejectReason, RolloutGroup
from sapo.protocol.verify import VerifyPolicy, verify
from sapo.sampling.inbox import Inbox
from sapo.training.rewards import Verifier, score_group
from sapo.training.rollouts import QuestionGroup

log = logging.getLogger("sapo.intake")

# Clocks disagree between machines; a message "from the future" beyond this is suspect.
CLOCK_SKEW_SECONDS = 120.0


class Intake:
    def __init__(
        self,
        inbox: Inbox,
        counters: NodeCounters,
        *,
        swarm: str,
        local_peer_id: str,
        rg_version: str,
        limits: DecodeLimits,
        policy: VerifyPolicy,
        max_age_seconds: float,
        seen_capacity: int = 65_536,
        on_reject: Callable[[str, str], None] | None = None,
        verifier: Verifier = score_group,
    ):
        self.inbox = inbox
        self.counters = counters
        self.swarm = swarm
        self.local_peer_id = local_peer_id
        self.rg_version = rg_version
        self.limits = limits
        self.policy = policy
        self.max_age_seconds = max_age_seconds
        # Two memories: whole frames (a replay, honest when a peer rejoins: free) and content, the
        # sender with its question and completions, whatever the envelope says (a re-stamped
        # replay, never honest: charged).
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._contents: OrderedDict[bytes, None] = OrderedDict()
        self._seen_capacity = seen_capacity
        self.on_reject = on_reject
        self.verifier = verifier  # this node's own scoring: a peer's rewards are never used
        self.refusals = RefusalLog()  # a summary a minute in the log, not a line per group

    def accept(self, frame: bytes, signer: str, now: float) -> QuestionGroup | None:
        """Admit one frame from `signer` (the libp2p peer that signed it) or count why not."""
        self.counters.received += 1
        try:
            group = self._admit(frame, signer, now)
        except Rejected as exc:
            self.counters.rejected[exc.reason.value] += 1
            if exc.reason in (RejectReason.duplicate, RejectReason.unknown_modality):
                log.debug("rejected group from %s: %s", signer[:16], exc)  # routine: replays, other modalities
            else:
                self.refusals.refused(signer, exc.reason.value, exc.detail, now)
            if self.on_reject is not None:
                self.on_reject(signer, exc.reason.value)
            return None
        except Exception:  # noqa: BLE001 - a bug in a check must not take the node down
            self.counters.rejected["internal_error"] += 1
            log.exception("unexpected error while checking a group from %s", signer[:16])
            return None
        self.counters.accepted += 1
        self.counters.accepted_from[group.origin] += 1
        return group

    def _admit(self, frame: bytes, signer: str, now: float) -> QuestionGroup:
        digest = hashlib.sha256(frame).digest()
        if digest in self._seen:
            raise Rejected(RejectReason.duplicate, "same frame seen before (a replay)")
        self._remember(self._seen, digest)
        msg = decode(frame, self.limits)
        if msg.sender != signer:
            raise Rejected(RejectReason.sender_mismatch, f"sender field {msg.sender[:16]} but signed by {signer[:16]}")
        if msg.sender == self.local_peer_id:
            raise Rejected(RejectReason.duplicate, "our own group came back")
        if msg.swarm != self.swarm:
            raise Rejected(RejectReason.bad_schema, f"swarm {msg.swarm!r} is not ours ({self.swarm!r})")
        age = now - msg.created_at
        if age > self.max_age_seconds or age < -CLOCK_SKEW_SECONDS:
            raise Rejected(RejectReason.stale, f"created {age:.0f}s ago")
        content = content_digest(msg)
        if content in self._contents:
            raise Rejected(RejectReason.repeat, "this peer's question and completions again, in a new envelope")
        group = verify(msg, local_rg_version=self.rg_version, policy=self.policy, verifier=self.verifier)
        if not self.inbox.add(group, now):
            raise Rejected(RejectReason.oversized, "group alone exceeds the inbox byte cap")
        self._remember(self._contents, content)  # only what got in: a refused group may be fixed and sent again
        return group

    def _remember(self, memory: OrderedDict[bytes, None], digest: bytes) -> None:
        memory[digest] = None
        if len(memory) > self._seen_capacity:
            memory.popitem(last=False)


def content_digest(msg: RolloutGroup) -> bytes:
    """What a group is: its author, its problem and its completions. Nothing of the envelope
    (timestamp, round, model name, the sender's own rewards) takes part, so changing it makes
    no new group."""
    content = {"sender": msg.sender, "problem": msg.problem.model_dump(mode="json"), "completions": list(msg.completions)}
    return hashlib.sha256(canonical_json(content)).digest()
