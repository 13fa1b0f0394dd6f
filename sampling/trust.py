"""Settings for how far a node trusts strangers: the screen of peers' completions
(sampling/screen.py) and authors' standing (sampling/standing.py). The defaults are what
bench/poisoning.py measured (docs/security.md); `off` gives back the node of sapo 0.3.0, which
trained on any verified group, chosen uniformly, whoever sent it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sapo.sampling.standing import RAMP_SECONDS


class TrustSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    screen: Literal["typicality", "off"] = Field(
        default="typicality",
        description="screen peers' completions before training on them: typicality refuses a group whose "
        "winning completion holds a stretch of text (outside the answer) that this node's own policy finds far "
        "more surprising than its own samples (an injected phrase, working it would not write); off trains on "
        "any verified group",
    )
    screen_window: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="tokens in the stretch the screen sums excess surprise over (the longest stretch, if shorter)",
    )
    screen_margin: float = Field(
        default=4.0,
        ge=0.0,
        le=1000.0,
        description="nats of excess surprise a peer's completion may show beyond the 99th percentile of this "
        "node's own recent completions before its group is refused",
    )
    standing: Literal["earned", "off"] = Field(
        default="earned",
        description="earned: an author's share of the inbox and of the external draw grows with the time since "
        "its first verified group with signal that this node asked for (pushes earn nothing), falls with what the "
        "screen drops from its groups, and all authors below full standing share one newcomers' budget; off: every "
        "group weighs alike, whoever sent it",
    )
    standing_ramp_seconds: float = Field(
        default=RAMP_SECONDS,
        gt=0,
        le=30 * 86400.0,
        description="seconds from an author's first verified group with signal to full standing",
    )
    newcomer_share: float = Field(
        default=0.1,
        gt=0,
        le=100.0,
        description="what all authors below full standing weigh together, in units of one established author",
    )
