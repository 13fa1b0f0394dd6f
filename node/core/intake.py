"""The receive path: frame -> decoded message -> checks -> a verdict: a verified group, or a refusal.

Every refusal has a named reason, counted per reason; nothing a peer sends can raise past here.
The intake stores no group: its verdict goes back to the exchange, on the trio thread, which
keeps an accepted group (`NodeMemory.store`) and charges a refusal to the sender's peer score
through the network, so a peer that keeps sending junk ends up banned.

The checks run cheapest first: the author's memory of frames (a hash), decoding (bounded), the
envelope (sender, swarm, age), the author's memory of contents, and only then, if the author has
verifications left in its budget (`VERIFY_RATE` a second, up to `VERIFY_BURST` at once; past it
`over_budget`, charged), the expensive one: regenerating the problem and re-scoring every
completion. A verification that takes more CPU than `VERIFY_CPU_SECONDS` costs its author that
many more verifications, and one whose scoring runs past its budget is refused (`too_costly`).
A peer that floods flat groups at the gossip limit (50/s) runs over its budget and is
banned within seconds, while an honest node, weak or strong, publishes well under it.

The memories are per author (protocol/toolkit/recent.py) and keep everything an author had verified for
as long as it would pass the age check, so that a replay of an older message is always refused
as `duplicate` (same frame, free) or `stale` (free), never as `repeat`: only a frame the author
signed anew with the same content is a `repeat`. Nothing that fails the envelope is remembered,
so a flood of stale or foreign frames cannot push anything out.

Only a group that can teach this node takes inbox room: one whose completions all earn the same
reward from this node's verifier has all-zero advantages, so it is refused (`no_signal`), unless
the node adds completions of its own to external groups (`keep_groups_without_signal`).

A peer's shared log-probs (`accept_logprobs`, their own message and topic) wait, briefly and
bounded, for the group they name, and ride into the inbox with it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

from sapo.node.core.counters import NodeCounters
from sapo.node.core.refusal_log import RefusalLog
from sapo.node.core.settings import NodeSettings
from sapo.protocol.toolkit.buckets import TokenBuckets
from sapo.protocol.toolkit.recent import RecentByAuthor
from sapo.protocol.wire.codec import DecodeLimits, decode, decode_logprobs, group_digest
from sapo.protocol.wire.messages import BehaviorLogprobs, Rejected, RejectReason, check_behavior_rows
from sapo.protocol.wire.verify import VerifyPolicy, verify, work_seconds
from sapo.sampling.inbox import group_size_bytes
from sapo.training.bounded import BoundedMap
from sapo.training.learning.grpo import has_signal
from sapo.training.problems.rewards import Verifier, score_group
from sapo.training.problems.rollouts import Behavior, QuestionGroup

log = logging.getLogger("sapo.intake")

# Clocks disagree between machines; a message "from the future" beyond this is suspect.
CLOCK_SKEW_SECONDS = 120.0
# Shared log-probs wait for their group at most this long (the sender publishes them just before
# it), and all of them together hold at most this many values (~32 bytes each in Python lists).
LOGPROBS_WAIT_SECONDS = 60.0
LOGPROBS_MAX_VALUES = 1_000_000
# Verifications (regenerate + re-score, ~1 ms for basic_arithmetic, more for other tasks) each
# author may cost us: above any honest node's publishing rate (an untrained tiny model on a fast
# CPU publishes up to ~30 groups a second, all of them flat), below the gossip limit of 50 a
# second (NetworkSettings.peer_message_rate), so a peer sending at that limit is 10 a second over
# and banned in ~20 s (each refusal costs 1 point, peer_guard.PENALTIES). The burst is the gossip
# burst: a round's groups published at once.
VERIFY_RATE = 40.0
VERIFY_BURST = 100
# A verification is one unit of that budget while regenerating the problem and scoring its
# completions take at most this much of the worker's CPU (an honest default group takes 1-3 ms);
# one that takes more is charged in proportion, so what an author sends costs it what it costs
# us: at most VERIFY_RATE units, 0.2 CPU-seconds a second, for long. The spec is the author's
# choice too: an allowlisted bf spec can take 140 ms to regenerate, and pays 28 units. Garbage
# collection is not charged (verify.work_seconds). The debt an author can run up is one burst.
VERIFY_CPU_SECONDS = 0.005
# Authors whose budget we keep; one forgotten (the least recently heard) starts afresh.
BUDGET_AUTHORS = 4096


@dataclass(frozen=True)
class Verdict:
    """What the intake made of one frame: the verified group to keep (None for log-probs, which
    wait inside the intake for their group), and the reason it was refused, if it was."""

    group: QuestionGroup | None = None
    refusal: str | None = None  # a RejectReason's value
    logprobs: int = 0  # the groups a log-probs message named, now waiting for them


class Intake:
    def __init__(
        self,
        counters: NodeCounters,
        *,
        swarm: str,
        local_peer_id: str,
        rg_version: str,
        limits: DecodeLimits,
        policy: VerifyPolicy,
        max_age_seconds: float,
        max_group_bytes: int,
        seen_capacity: int = 65_536,
        verifier: Verifier = score_group,
        keep_groups_without_signal: bool = False,
    ):
        # Imported now, not by the first group to need a generator: the import takes most of a
        # second, which would be charged to that group's author.
        import reasoning_gym  # noqa: F401

        self.max_group_bytes = max_group_bytes  # the inbox's byte cap: a group over it alone can never be kept
        self.counters = counters
        self.swarm = swarm
        self.local_peer_id = local_peer_id
        self.rg_version = rg_version
        self.limits = limits
        self.policy = policy
        self.max_age_seconds = max_age_seconds
        # Two memories per author, of what passed the envelope and its budget: whole frames (a
        # replay, honest when a peer rejoins: free) and the content of accepted groups, the sender
        # with its question and completions, with the frame that brought it (the same content in
        # another frame is a re-stamped replay only its author can sign: charged). An author can
        # have at most this many verified within the age window, so none is forgotten before a
        # replay of it would be stale.
        per_author = min(seen_capacity, math.ceil(VERIFY_RATE * (max_age_seconds + CLOCK_SKEW_SECONDS)) + VERIFY_BURST)
        self._frames: RecentByAuthor[None] = RecentByAuthor(per_author, seen_capacity, ttl=max_age_seconds)
        self._contents: RecentByAuthor[bytes] = RecentByAuthor(per_author, seen_capacity, ttl=max_age_seconds)
        # each author's verifications left, least recently heard first; a costly one runs a debt
        self._budgets: TokenBuckets[str] = TokenBuckets(
            VERIFY_RATE, VERIFY_BURST, BUDGET_AUTHORS, floor=-float(VERIFY_BURST)
        )
        self.verifier = verifier  # this node's own scoring: a peer's rewards are never used
        self.refusals = RefusalLog()  # a summary a minute in the log, not a line per group
        # A node that samples its own completions for each external question (augment) can learn
        # from a group whose completions all score alike: the contrast comes from its own.
        self.keep_groups_without_signal = keep_groups_without_signal
        # (author, group digest) -> (log-probs, arrival time), oldest first; `_pending_values` bounds them
        self._pending: BoundedMap[tuple[str, bytes], tuple[BehaviorLogprobs, float]] = BoundedMap(LOGPROBS_MAX_VALUES)
        self._pending_values = 0
        # Checks run in the exchange's worker thread while a checkpoint saves the memories from
        # another: one at a time, so that a saved copy is of memories between two frames.
        self._lock = threading.Lock()

    def accept(self, frame: bytes, signer: str, now: float) -> Verdict:
        """Check one frame from `signer` (the libp2p peer that signed it): the group to keep, or
        why not (counted)."""
        with self._lock:
            return self._accept(frame, signer, now)

    def _accept(self, frame: bytes, signer: str, now: float) -> Verdict:
        self.counters.received += 1
        try:
            group = self._admit(frame, signer, now)
        except Exception as exc:  # noqa: BLE001 - Rejected, or a bug in a check: never past here
            return self._refused(exc, signer, "group", now)
        self.counters.accepted += 1
        self.counters.accepted_from[group.origin] += 1
        return Verdict(group=group)

    def accept_logprobs(self, frame: bytes, signer: str, now: float) -> Verdict:
        """Hold a peer's shared log-probs until the groups they name arrive (no group to keep)."""
        with self._lock:
            return self._accept_logprobs(frame, signer, now)

    def _accept_logprobs(self, frame: bytes, signer: str, now: float) -> Verdict:
        self.counters.logprobs["received"] += 1
        try:
            msg = decode_logprobs(frame, self.limits)
            self._check_envelope(msg.sender, msg.swarm, msg.created_at, signer, now)
        except Exception as exc:  # noqa: BLE001 - as in accept
            return self._refused(exc, signer, "log-probs", now)
        for entry in msg.groups:
            key = (signer, bytes.fromhex(entry.group))
            if self._contents.contains(signer, key[1]):
                self.counters.logprobs["late"] += 1  # its group is in already: a group is never changed after
                continue
            self._hold(key, entry.behavior, now)
        return Verdict(logprobs=len(msg.groups))

    def _refused(self, exc: Exception, signer: str, what: str, now: float) -> Verdict:
        if not isinstance(exc, Rejected):  # a bug in a check must not take the node down
            self.counters.rejected["internal_error"] += 1
            log.error("unexpected error while checking %s from %s", what, signer[:16], exc_info=exc)
            return Verdict(refusal="internal_error")
        self.counters.rejected[exc.reason.value] += 1
        if exc.reason in (RejectReason.duplicate, RejectReason.unknown_modality):
            log.debug("rejected %s from %s: %s", what, signer[:16], exc)  # routine: replays, other modalities
        else:
            self.refusals.refused(signer, exc.reason.value, exc.detail, now)
        return Verdict(refusal=exc.reason.value)

    def _admit(self, frame: bytes, signer: str, now: float) -> QuestionGroup:
        digest = hashlib.sha256(frame).digest()
        if self._frames.contains(signer, digest):
            raise Rejected(RejectReason.duplicate, "same frame seen before (a replay)")
        msg = decode(frame, self.limits)
        self._check_envelope(msg.sender, msg.swarm, msg.created_at, signer, now)
        content = group_digest(msg)
        original = self._contents.get(signer, content)
        if original == digest:  # its frame was forgotten before its content: a replay still
            raise Rejected(RejectReason.duplicate, "same frame seen before (a replay)")
        if original is not None:
            raise Rejected(RejectReason.repeat, "this peer's question and completions again, in a new envelope")
        self._spend_verification(signer, now)
        self._frames.put(signer, digest, None, stamp=msg.created_at, now=now)
        started = work_seconds()
        try:
            group = verify(msg, local_rg_version=self.rg_version, policy=self.policy, verifier=self.verifier)
        finally:
            self._charge_cpu(signer, work_seconds() - started)
        logprobs = self._take((signer, content))
        if not self.keep_groups_without_signal and not has_signal(group.rewards):
            raise Rejected(
                RejectReason.no_signal, f"all {len(group.rewards)} completions score {group.rewards[0]:g} here"
            )
        group = self._with_logprobs(group, logprobs)
        if group_size_bytes(group) > self.max_group_bytes:
            raise Rejected(RejectReason.oversized, "group alone exceeds the inbox byte cap")
        # only what passed: a refused group may be fixed and sent again
        self._contents.put(signer, content, digest, stamp=msg.created_at, now=now)
        return group

    def _spend_verification(self, author: str, now: float) -> None:
        """Take one verification from `author`'s budget, or refuse (over_budget) when it has none."""
        if not self._budgets.take(author, now):
            raise Rejected(RejectReason.over_budget, f"over its budget of {VERIFY_RATE:g} verified groups a second")

    def _charge_cpu(self, author: str, seconds: float) -> None:
        """Charge `author` for a verification that took `seconds` of CPU beyond its one unit."""
        extra = seconds / VERIFY_CPU_SECONDS - 1.0
        if extra <= 0.0:
            return
        self._budgets.charge(author, extra)

    def _check_envelope(self, sender: str, swarm: str, created_at: float, signer: str, now: float) -> None:
        if sender != signer:
            raise Rejected(RejectReason.sender_mismatch, f"sender field {sender[:16]} but signed by {signer[:16]}")
        if sender == self.local_peer_id:
            raise Rejected(RejectReason.duplicate, "our own message came back")
        if swarm != self.swarm:
            raise Rejected(RejectReason.bad_schema, f"swarm {swarm!r} is not ours ({self.swarm!r})")
        age = now - created_at
        if age > self.max_age_seconds or age < -CLOCK_SKEW_SECONDS:
            raise Rejected(RejectReason.stale, f"created {age:.0f}s ago")

    def _hold(self, key: tuple[str, bytes], behavior: BehaviorLogprobs, now: float) -> None:
        self._take(key)
        self._pending_values += _values(behavior)
        dropped = self._pending.put(key, (behavior, now))
        if dropped is not None:
            self._unmatched(dropped[1][0])
        while (oldest := self._pending.oldest()) is not None and (
            self._pending_values > LOGPROBS_MAX_VALUES or now - oldest[1][1] > LOGPROBS_WAIT_SECONDS
        ):
            self._unmatched(self._pending.pop_oldest()[1][0])

    def _unmatched(self, behavior: BehaviorLogprobs) -> None:
        """Log-probs whose group never came, forgotten."""
        self._pending_values -= _values(behavior)
        self.counters.logprobs["unmatched"] += 1

    def _take(self, key: tuple[str, bytes]) -> BehaviorLogprobs | None:
        """The log-probs held for (author, group digest), no longer held."""
        held = self._pending.pop(key, None)
        if held is None:
            return None
        self._pending_values -= _values(held[0])
        return held[0]

    def _with_logprobs(self, group: QuestionGroup, behavior: BehaviorLogprobs | None) -> QuestionGroup:
        """The group with its author's shared log-probs, if they came and fit its completions."""
        if behavior is None:
            return group
        try:
            check_behavior_rows(behavior, group.completions)
        except ValueError:  # a row per completion, none longer than its text
            self.counters.logprobs["mismatched"] += 1
            return group
        self.counters.logprobs["joined"] += 1
        return group.model_copy(update={"behavior": Behavior(**behavior.model_dump())})

    def remembered(self) -> int:
        """How many verified frames the intake remembers (each author's, within the age window)."""
        with self._lock:
            return sum(len(entries) for _, entries in self._frames.entries())

    def to_json(self) -> dict[str, Any]:
        """The intake's memories: what each author had verified (a repeat of it is refused), its
        verification budget and the log-probs waiting for their group. Within a study they do
        change later accepts: a node that samples a question and completions it published a
        round before is refused as `repeat`. So a node's checkpoint keeps them (NodeMemory)."""
        with self._lock:
            return self._to_json()

    def _to_json(self) -> dict[str, Any]:
        return {
            "frames": _memory_to_json(self._frames),
            "contents": _memory_to_json(self._contents),
            "budgets": [[author, tokens, updated] for author, tokens, updated in self._budgets.entries()],
            "pending": [
                [author, digest.hex(), behavior.model_dump(mode="json"), arrived]
                for (author, digest), (behavior, arrived) in self._pending.items()
            ],
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Take the memories `to_json` saved into this intake, built with the same settings."""
        with self._lock:
            self._restore(saved)

    def _restore(self, saved: dict[str, Any]) -> None:
        _restore_memory(self._frames, saved["frames"])
        _restore_memory(self._contents, saved["contents"])
        self._budgets.restore(saved["budgets"])  # [author, tokens, when], least recently heard first
        self._pending = BoundedMap(
            LOGPROBS_MAX_VALUES,
            (
                ((author, bytes.fromhex(digest)), (BehaviorLogprobs.model_validate(behavior), arrived))
                for author, digest, behavior, arrived in saved["pending"]
            ),
        )
        self._pending_values = sum(_values(behavior) for behavior, _ in self._pending.values())


def node_intake(
    settings: NodeSettings, counters: NodeCounters, *, peer_id: str, rg_version: str, verifier: Verifier
) -> Intake:
    """A node's intake checks, as its settings say (the daemon's and the in-process hub's alike)."""
    net = settings.network
    return Intake(
        counters,
        swarm=net.swarm,
        local_peer_id=peer_id,
        rg_version=rg_version,
        limits=DecodeLimits(max_message_bytes=net.max_message_bytes),
        policy=VerifyPolicy(accept_other_rg_versions=net.accept_other_rg_versions),
        max_age_seconds=settings.sampling.inbox_max_age_seconds,
        max_group_bytes=settings.sampling.inbox_max_bytes,
        verifier=verifier,
        keep_groups_without_signal=settings.external_use.keeps_groups_without_signal,
    )


# A `RecentByAuthor` of digests as JSON, each author's entries in arrival order and the authors in
# theirs (both break ties in what it forgets first).
def _memory_to_json(memory: RecentByAuthor) -> list[list[Any]]:
    return [
        [author, [[_hex(key), None if value is None else _hex(value), stamp] for key, value, stamp in entries]]
        for author, entries in memory.entries()
    ]


def _hex(digest: Any) -> str:
    return bytes(digest).hex()  # the intake's keys and values are digests (bytes)


def _restore_memory(memory: RecentByAuthor, saved: list[list[Any]]) -> None:
    memory.restore(
        [
            (
                author,
                [
                    (bytes.fromhex(key), None if value is None else bytes.fromhex(value), stamp)
                    for key, value, stamp in entries
                ],
            )
            for author, entries in saved
        ]
    )


def _values(behavior: BehaviorLogprobs) -> int:
    return sum(len(row) for row in behavior.token_logprobs) + 1
