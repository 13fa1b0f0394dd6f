"""The wire contract: what one peer tells another about one question.

A peer shares *decoded rollouts*: the problem's spec (so anyone can regenerate it), the question
and answer key it claims, and G completion texts; never weights. The receiver trusts none of it:
`protocol.verify` regenerates the problem and re-scores the completions. A sender may also share
how likely its own policy found each sampled token (`SharedLogprobs`, on a topic of its own), which
a receiver with the same tokenizer can use to weigh those completions.

Field order, types and limits are documented in protocol/README.md ("Wire format"); what may
change between releases, and how, in its "Compatibility" section. Every model here skips fields
it does not know (`extra="ignore"`), within the decoder's size and nesting bounds: a later release
may add optional fields that this one reads past.
"""

from __future__ import annotations

import enum
import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import ProblemSpec

# Bump on any change a v1 reader would misread; see "Compatibility" in protocol/README.md.
SCHEMA_VERSION = 1
# The shared log-probs message (its own topic, its own version).
LOGPROBS_SCHEMA_VERSION = 1

# libp2p peer ids travel as base58btc text (no 0, O, I, l).
_BASE58 = r"^[1-9A-HJ-NP-Za-km-z]+$"

# msgpack can carry any int in [-2**63, 2**64); anything outside cannot be re-encoded.
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


class RejectReason(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() of a member, which logs and messages show
    """Why an inbound message was dropped. One metrics counter per value.

    Defined once here so that every layer (codec, verifier, gossip, inbox) counts the same way.
    """

    oversized = "oversized"  # frame, or its decompressed payload, is over max_message_bytes
    bad_frame = "bad_frame"  # empty frame or unknown header byte
    bad_compression = "bad_compression"  # zlib stream corrupt, truncated, or trailing bytes
    bad_msgpack = "bad_msgpack"  # not one well-formed msgpack object (incl. bad UTF-8, ext types)
    bad_schema = "bad_schema"  # the map does not validate as a RolloutGroup
    too_deep = "too_deep"  # metadata/config nested deeper than max_nesting
    unknown_schema_version = "unknown_schema_version"  # a version this node cannot read
    unknown_modality = "unknown_modality"  # not "text": ignore it, it is not an error
    unknown_dataset = "unknown_dataset"  # dataset not on the allowlist
    config_out_of_range = "config_out_of_range"  # config key/value not allowed, or generator failed
    too_many_completions = "too_many_completions"  # more than max_completions
    field_too_long = "field_too_long"  # a string, or the metadata, is over its limit
    spoofed_answer_key = "spoofed_answer_key"  # regenerated question/answer differ from the claim
    unverifiable_version = "unverifiable_version"  # sender's reasoning-gym differs from ours
    sender_mismatch = "sender_mismatch"  # `sender` is not the libp2p peer that signed it (gossip)
    duplicate = "duplicate"  # already seen (gossip/inbox)
    repeat = "repeat"  # a peer's own earlier group again, the same question and completions under a new envelope
    stale = "stale"  # too old a round or timestamp (gossip/inbox)
    peer_quota = "peer_quota"  # this peer has sent too much lately (gossip/inbox)
    no_signal = "no_signal"  # every completion earns the same reward here: nothing to learn from it (intake)
    over_budget = "over_budget"  # more groups to verify a second than any honest node sends (intake)
    too_costly = "too_costly"  # its completions took more CPU to score than any honest group (verify)


class Rejected(Exception):
    """An inbound message was refused. `reason` is for counters, `detail` for one log line."""

    def __init__(self, reason: RejectReason, detail: str):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


def _check_plain_data(value: Any) -> Any:
    """Free-form maps (metadata, config) may hold only what msgpack and JSON both round-trip."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise ValueError(f"map keys must be strings, got {type(key).__name__}")
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, bool) or item is None or isinstance(item, str):
            pass
        elif isinstance(item, int):
            if not _INT_MIN <= item <= _INT_MAX:
                raise ValueError("integer out of msgpack range")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError("floats must be finite")
        else:
            raise ValueError(f"only str/int/float/bool/None/list/map allowed, got {type(item).__name__}")
    return value


PlainMap = Annotated[dict[str, Any], AfterValidator(_check_plain_data)]


# Known fields are validated strictly; unknown ones are skipped (the codec bounds their nesting
# and the frame bounds their size), so an optional field added by a later release reads as absent.
_WIRE = ConfigDict(extra="ignore", frozen=True, strict=True, allow_inf_nan=False)


class WireProblemSpec(BaseModel):
    """The wire twin of `training.tasks.ProblemSpec`: the same fields, validated strictly."""

    model_config = _WIRE

    dataset: str = Field(min_length=1, description="ReasoningGYM dataset name")
    config: PlainMap = Field(description="dataset config overrides; checked by protocol.allowlist")
    seed: int = Field(ge=0, lt=2**63, description="dataset seed")
    index: int = Field(ge=0, lt=2**31, description="item index within the seeded dataset")

    @classmethod
    def from_spec(cls, spec: ProblemSpec) -> WireProblemSpec:
        return cls(dataset=spec.dataset, config=dict(spec.config), seed=spec.seed, index=spec.index)

    def to_spec(self) -> ProblemSpec:
        return ProblemSpec(dataset=self.dataset, config=self.config, seed=self.seed, index=self.index)


class BehaviorLogprobs(BaseModel):
    """How likely the sender's own policy found each token it sampled. A receiver with the same
    tokenizer can weigh the sender's completions by how likely its own policy finds them
    (`--importance-weight`); any other receiver ignores this. Shared only with `--share-logprobs`,
    in a `SharedLogprobs` message."""

    model_config = _WIRE

    tokenizer: str = Field(min_length=1, max_length=128, description="fingerprint of the sender's tokenizer")
    temperature: float = Field(gt=0, le=5, description="the temperature the completions were sampled at")
    token_logprobs: list[list[float]] = Field(
        description="per completion, the log-probability of each sampled token at that temperature (EOS excluded)"
    )

    @model_validator(mode="after")
    def _are_logprobs(self) -> BehaviorLogprobs:
        if any(value > 0 for row in self.token_logprobs for value in row):
            raise ValueError("a log-probability is at most 0")
        return self


class RolloutGroup(BaseModel):
    """One question and G completions, as gossiped. Field order here is the documented order."""

    model_config = _WIRE

    # A plain strict int pinned by bounds: Literal[1] would also accept True and 1.0.
    schema_version: int = Field(
        ge=SCHEMA_VERSION, le=SCHEMA_VERSION, description="wire schema version; see SCHEMA_VERSION"
    )
    sender: str = Field(pattern=_BASE58, description="libp2p peer id of the author, base58")
    swarm: str = Field(min_length=1, description="swarm name; peers ignore other swarms")
    sender_round: int = Field(ge=0, lt=2**63, description="the sender's round counter")
    created_at: float = Field(ge=0, description="unix seconds when the sender built it")
    modality: Literal["text"] = Field(description='"text" is the only modality in v1')
    problem: WireProblemSpec
    question: str = Field(description="the question as the sender generated it")
    answer: str = Field(description="the answer key as the sender generated it (never trusted)")
    metadata: PlainMap = Field(description="the generator's metadata (informational)")
    model_id: str = Field(description="the sender's model name, informational")
    completions: list[str] = Field(min_length=1, description="G decoded completion texts")
    sender_rewards: list[float] = Field(
        description="the sender's own scores; informational only, never used for training"
    )
    reasoning_gym_version: str = Field(min_length=1, description="sender's reasoning-gym release")
    # Read, never written: release 0.2.0 put the shared log-probs here, under v1, and release 0.1.0
    # refuses a frame that holds it. This release sends them as SharedLogprobs instead.
    behavior: BehaviorLogprobs | None = Field(
        default=None,
        description="optional, read only: the sender's token log-probabilities, as release 0.2.0 sent them",
    )

    @model_validator(mode="after")
    def _rewards_match_completions(self) -> RolloutGroup:
        if len(self.sender_rewards) != len(self.completions):
            raise ValueError(f"{len(self.completions)} completions but {len(self.sender_rewards)} sender_rewards")
        if self.behavior is not None:
            check_behavior_rows(self.behavior, self.completions)
        return self


def check_behavior_rows(behavior: BehaviorLogprobs, completions: list[str]) -> None:
    """A row of log-probs per completion, each no longer than its completion's UTF-8 bytes: a
    sampled token is at least one byte of text, so a longer row is padding that costs the sender
    a byte on the wire (zlib) and us eight in memory."""
    rows = behavior.token_logprobs
    if len(rows) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(rows)} behavior rows")
    for row, text in zip(rows, completions):
        if len(row) > len(text.encode("utf-8")):
            raise ValueError(f"a behavior row of {len(row)} tokens for a completion of {len(text.encode())} bytes")


def to_wire(
    group: QuestionGroup,
    *,
    sender: str,
    swarm: str,
    sender_round: int,
    model_id: str,
    created_at: float,
    reasoning_gym_version: str,
) -> RolloutGroup:
    """Package a local question group for gossip. Raises pydantic.ValidationError on bad input."""
    problem = group.problem
    return RolloutGroup(
        schema_version=SCHEMA_VERSION,
        sender=sender,
        swarm=swarm,
        sender_round=sender_round,
        created_at=float(created_at),
        modality="text",
        problem=WireProblemSpec.from_spec(problem.spec),
        question=problem.question,
        answer=problem.answer,
        metadata=dict(problem.metadata),
        model_id=model_id,
        completions=list(group.completions),
        sender_rewards=[float(r) for r in group.rewards],
        reasoning_gym_version=reasoning_gym_version,
    )


class GroupLogprobs(BaseModel):
    """The log-probs of one group, named by the group's digest (`codec.group_digest`)."""

    model_config = _WIRE

    group: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="sha256 of the group's author, problem and completions, hex"
    )
    behavior: BehaviorLogprobs


class SharedLogprobs(BaseModel):
    """A sender's log-probs for groups it published, on the topic `sapo/<swarm>/logprobs/1`.

    Apart from its groups because a release-0.1.0 reader refuses any field it does not know, and
    charges the sender for it: it never subscribes to this topic, so it never sees this. The
    sender publishes it just before the groups it names; the receiver joins the two by digest."""

    model_config = _WIRE

    schema_version: int = Field(
        ge=LOGPROBS_SCHEMA_VERSION, le=LOGPROBS_SCHEMA_VERSION, description="see LOGPROBS_SCHEMA_VERSION"
    )
    sender: str = Field(pattern=_BASE58, description="libp2p peer id of the author, base58; the groups' author too")
    swarm: str = Field(min_length=1)
    created_at: float = Field(ge=0, description="unix seconds when the sender built it")
    groups: list[GroupLogprobs] = Field(min_length=1)
