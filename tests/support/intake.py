"""The intake as a node builds it, with the real codec, verifier and inbox, and every refusal
it charges to a peer recorded for the test to read."""

from __future__ import annotations

from sapo.node.core.counters import NodeCounters
from sapo.node.core.intake import Intake
from sapo.node.study.nodes import peer_id_for
from sapo.protocol.codec import DecodeLimits
from sapo.protocol.verify import VerifyPolicy
from sapo.sampling.inbox import Inbox
from sapo.training.rewards import Verifier, score_group
from sapo.training.tasks import reasoning_gym_version

ME = peer_id_for(0, 0)  # the receiving node


def intake(keep: bool = False, verifier: Verifier = score_group) -> tuple[Intake, list[tuple[str, str]]]:
    """(the intake, the (signer, reason) of every refusal it charged); `keep`: keep groups
    without signal."""
    charged: list[tuple[str, str]] = []
    return Intake(
        Inbox(64, 2**22, 600),
        NodeCounters(),
        swarm="t",
        local_peer_id=ME,
        rg_version=reasoning_gym_version(),
        limits=DecodeLimits(),
        policy=VerifyPolicy(),
        max_age_seconds=600,
        on_reject=lambda signer, reason: charged.append((signer, reason)),
        keep_groups_without_signal=keep,
        verifier=verifier,
    ), charged
