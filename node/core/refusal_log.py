"""What the log says about refused groups: one DEBUG line per group, and at most one INFO
summary a minute by reason.

A peer that keeps sending groups this node refuses (another task table, a clock out of step,
junk) would otherwise write a line per group for as long as it runs: hours of a swarm filled
node.log with them. Every refusal is still counted, per reason, in the node's counters (the page,
metrics.jsonl, Prometheus); the log only says that it is happening and why.
"""

from __future__ import annotations

import logging
from collections import Counter

log = logging.getLogger("sapo.intake")

SUMMARY_SECONDS = 60.0


class RefusalLog:
    """The first refusal is summarized at once; later ones with the next refusal at least
    `every` seconds after the last summary. Holds counts by reason, never the groups."""

    def __init__(self, every: float = SUMMARY_SECONDS):
        self.every = every
        self._pending: Counter[str] = Counter()
        self._signers: set[str] = set()  # emptied with every summary: at most a minute's senders
        self._since: float | None = None
        self._last_summary: float | None = None
        self._latest = ""

    def refused(self, signer: str, reason: str, detail: str, now: float) -> None:
        log.debug("rejected group from %s: %s: %s", signer[:16], reason, detail)
        if not self._pending:
            self._since = now
        self._pending[reason] += 1
        self._signers.add(signer)
        self._latest = f"{reason} from {signer[:16]}: {detail}"
        if self._last_summary is None or now - self._last_summary >= self.every:
            self._summarize(now)

    def _summarize(self, now: float) -> None:
        count = sum(self._pending.values())
        reasons = ", ".join(f"{reason} {n}" for reason, n in self._pending.most_common())
        seconds = now - (self._since if self._since is not None else now)
        log.info(
            "refused %d group(s) from %d peer(s) in %.0f s: %s (latest: %s)",
            count,
            len(self._signers),
            seconds,
            reasons,
            self._latest,
        )
        self._pending.clear()
        self._signers.clear()
        self._last_summary = now
