"""The intake as a node builds it, with the real codec, verifier and inbox, and every refusal
it charges to a peer recorded for the test to read."""

from __future__ import annotations

from sapo.node.study.nodes import peer_id_for
from sapo.sampling.inbox import Inbox
from sapo.training.problems.rewards import Verifier, score_group
from tests.support.receiving import Receiver, memory_of

ME = peer_id_for(0, 0)  # the receiving node


def intake(keep: bool = False, verifier: Verifier = score_group) -> tuple[Receiver, list[tuple[str, str]]]:
    """(the intake with what the exchange does with its verdicts, the (signer, reason) of every
    refusal it charged); `keep`: keep groups without signal."""
    charged: list[tuple[str, str]] = []
    memory = memory_of(
        Inbox(64, 2**22, 600),
        swarm="t",
        local_peer_id=ME,
        max_age_seconds=600,
        keep_groups_without_signal=keep,
        verifier=verifier,
    )
    return Receiver(memory, penalize=lambda signer, reason: charged.append((signer, reason))), charged
