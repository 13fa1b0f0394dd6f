"""A fuzz run: N hostile frames through `codec.decode` and `Intake.accept`.

The first `hypothesis_cases` are drawn by hypothesis (generate-only) from
tests/support/strategies.py `hostile_frames()`, the rest are random byte-level mutations (flip,
insert, delete, truncate, splice) of those and of valid frames, which is ~50x faster than drawing
them all. The report counts cases, accepted groups, rejections by reason, and exceptions that
escaped (must be 0: decode may only raise Rejected, Intake.accept nothing, and `internal_error`
counts a bug caught inside it).
"""

from __future__ import annotations

import collections
import random
import time
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed

from sapo.node.core.counters import NodeCounters
from sapo.node.core.intake import Intake
from sapo.protocol.wire.codec import DecodeLimits, decode, encode
from sapo.protocol.wire.messages import Rejected
from sapo.protocol.wire.verify import VerifyPolicy
from sapo.training.problems.tasks import reasoning_gym_version
from tests.support.strategies import SAMPLE_SENDER, hostile_frames, sample_message


@dataclass
class FuzzReport:
    cases: int = 0
    decoded: int = 0
    accepted: int = 0
    decode_rejected: collections.Counter = field(default_factory=collections.Counter)
    intake_rejected: collections.Counter = field(default_factory=collections.Counter)
    escaped: collections.Counter = field(default_factory=collections.Counter)
    seconds: float = 0.0

    def lines(self) -> list[str]:
        out = [
            f"fuzz: {self.cases} cases in {self.seconds:.0f}s ({self.cases / max(self.seconds, 1e-9):.0f}/s)",
            f"  decoded to a RolloutGroup: {self.decoded}; accepted by the intake: {self.accepted}",
            "  decode rejected: " + ", ".join(f"{k}={v}" for k, v in self.decode_rejected.most_common()),
            "  intake rejected: " + ", ".join(f"{k}={v}" for k, v in self.intake_rejected.most_common()),
            f"  exceptions escaped: {sum(self.escaped.values())} {dict(self.escaped) or ''}",
        ]
        return out


def mutate(rng, frame: bytes, pool: list[bytes]) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        if op == 0 and data:  # flip a byte
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif op == 1:  # insert bytes
            at = rng.randrange(len(data) + 1)
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and data:  # delete a run
            at = rng.randrange(len(data))
            del data[at : at + rng.randint(1, 16)]
        elif op == 3 and data:  # truncate
            del data[rng.randrange(len(data)) :]
        else:  # splice with another frame
            other = rng.choice(pool)
            data = data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1) :]
    return bytes(data)


def fuzz(cases: int, seed: int = 0, hypothesis_cases: int = 3000) -> FuzzReport:
    report = FuzzReport()
    limits = DecodeLimits()
    counters = NodeCounters()
    # the strategies' valid frames carry swarm "sapo-test", a 2023 timestamp and reasoning-gym 0.1.25
    intake = Intake(
        counters,
        max_group_bytes=64 << 20,
        swarm="sapo-test",
        local_peer_id="me",
        rg_version=reasoning_gym_version(),
        limits=limits,
        policy=VerifyPolicy(accept_other_rg_versions=True),
        max_age_seconds=1e12,
    )
    now = 1_700_000_100.0
    pool: list[bytes] = [encode(sample_message()), encode(sample_message(), compress=True)]

    def run_one(frame: bytes) -> None:
        report.cases += 1
        signer = SAMPLE_SENDER
        try:
            msg = decode(frame, limits)
            report.decoded += 1
            signer = msg.sender  # signed by its claimed sender, so the intake goes on to verify it
        except Rejected as exc:
            report.decode_rejected[exc.reason.value] += 1
        except Exception as exc:  # noqa: BLE001 - what we are counting
            report.escaped[f"decode:{type(exc).__name__}"] += 1
        try:
            if intake.accept(frame, signer, now).group is not None:
                report.accepted += 1
        except Exception as exc:  # noqa: BLE001
            report.escaped[f"intake:{type(exc).__name__}"] += 1

    @hseed(seed)
    @settings(
        max_examples=min(cases, hypothesis_cases),
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(hostile_frames())
    def drawn(frame: bytes) -> None:
        if len(pool) < 2000 and len(frame) < 64 * 1024:
            pool.append(frame)
        run_one(frame)

    started = time.perf_counter()
    drawn()
    rng = random.Random(seed)
    while report.cases < cases:
        run_one(mutate(rng, rng.choice(pool), pool))
    report.seconds = time.perf_counter() - started
    report.intake_rejected = collections.Counter(counters.rejected)
    if counters.rejected.get("internal_error"):
        report.escaped["intake:internal_error"] += counters.rejected["internal_error"]
    return report
