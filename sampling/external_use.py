"""How a node uses the external groups it takes: one typed value for every variant the study
compared (docs/science.md, "Every way of using external groups").

The defaults are what the study supports: drop groups without signal and sample uniformly,
score a peer's completions with the task's own verifier, and train a peer's completion only
when it beats its group. Every other value is a treatment the study ran as a control or an
alternative; `sapo-node start --help` lists them under "the study's treatments". A study arm
sets one such value (node/study/settings.py, TREATMENTS), and one pure step
(training_set.py) applies it, so the round itself never branches on a treatment.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The strategies in strategies.py, by name; named here so settings are checked without torch.
SamplerName = Literal["nonzero-uniform", "uniform", "has-correct", "any-correct", "peer-weighted"]


class ExternalUse(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sampler: SamplerName = Field(
        default="nonzero-uniform",
        description="how external groups are chosen: nonzero-uniform (drop all-zero-advantage groups, "
        "then uniform; the paper's controlled run), uniform (all received groups; the open demo), "
        "has-correct (mixed groups holding a fully correct answer), any-correct (groups holding a fully correct "
        "answer, all-correct ones too: for --augment-external) or peer-weighted (favour peers whose "
        "past groups were useful)",
    )
    external_credit: Literal["partial", "exact"] = Field(
        default="partial",
        description="how a peer's completions are scored: partial (the task's own score, partial credit included) "
        "or exact (1 only for a fully correct answer); under the default binary --reward both give 0 or 1",
    )
    augment_external: int = Field(
        default=0,
        ge=0,
        le=64,
        description="receiver-augmented groups: sample this many completions of our own for each external "
        "question and compute advantages over the union (0 = off)",
    )
    # "positive" by default: with the paper's "all", a peer's failures pushed the shared closing tag
    # down until every node of the 4/4 pilot lost the answer format (docs/science.md, "What sharing
    # does to the update"); tests/training/test_off_policy_rows.py plays that mechanism.
    off_policy_rows: Literal["all", "positive"] = Field(
        default="positive",
        description="which completions that this node did not sample itself (a peer's) train: only those with "
        "positive advantage, or all of them, as the paper does",
    )
    own_rows: Literal["all", "positive"] = Field(
        default="all",
        description="which of this node's own completions train: all of them (GRPO), or only those with positive "
        "advantage (a control for --off-policy-rows positive)",
    )
    importance_weight: Literal["off", "sequence"] = Field(
        default="off",
        description="weigh each completion this node did not sample by min(1, its per-token geometric mean of "
        "p_this_node / p_sender), from the log-probs a peer with the same tokenizer shares (--share-logprobs); "
        "completions without them, or from another tokenizer, keep weight 1",
    )
    share_logprobs: bool = Field(
        default=False,
        description="publish our own token log-probs for our groups, on their own topic (sapo/<swarm>/logprobs/1): "
        "peers with the same tokenizer can then weigh our completions (--importance-weight sequence); the groups "
        "themselves go out as before, so every release reads them",
    )

    @property
    def keeps_groups_without_signal(self) -> bool:
        """Whether a peer's group whose completions all earn the same reward can still teach this
        node: only when our own completions are added to it, which can give it the contrast."""
        return self.augment_external > 0
