"""Realistic rollout groups for the gossip benchmarks: real problems, reasoning-like text, real rewards.

A group is one easy basic_arithmetic question with 8 completions of about 1,000 characters of
step-by-step text ending in <answer>N</answer>, half of them right, scored by the real verifier.
Used by bench/gossip.py, bench/gossip_peer.py and the network benchmarks built on them.
"""

from __future__ import annotations

import random

COMPLETIONS_PER_GROUP = 8
COMPLETION_CHARS = 1_000  # about 256 tokens of SmolLM2 text
GROUPS_PER_NODE_POOL = 8  # distinct questions per node, reused round after round

_OPENERS = [
    "Let me work through this step by step.",
    "First, I need to understand what the question is asking.",
    "Okay, so the problem gives us an expression to evaluate.",
    "We start by looking at each term carefully.",
]
_STEPS = [
    "The first number is {a} and the second number is {b}, so combining them gives {c}.",
    "If I add {a} and {b}, I get {c}, but I should double-check the sign of each term.",
    "Subtracting {b} from {a} leaves {c}; let me verify that by counting up from {b}.",
    "Another way to see it: {a} plus {b} is the same as {b} plus {a}, which is {c}.",
    "Wait, I made a mistake earlier, so let me redo the calculation with {a} and {b}.",
    "Checking again, {a} and {b} together make {c}, which matches what I found before.",
    "Since the operation is applied from left to right, the intermediate result is {c}.",
    "Hmm, the order matters here, because {a} minus {b} is not the same as {b} minus {a}.",
    "Breaking {a} into tens and ones makes it easier to combine with {b}, giving {c}.",
    "So far the running total is {c}, and there are no more terms to process.",
]


# Free-form clauses between the templated steps: without them the text is far more
# repetitive than a model's, and zlib would shrink it 4x instead of the 2-2.5x of real prose.
_WORDS = (
    "the a this that we it so then now here because since which when if and but or not also only "
    "first next last again still just really maybe perhaps clearly actually probably exactly "
    "number numbers sum difference result total value digit digits term terms sign answer step "
    "steps problem question expression equation operation order carry borrow tens ones place "
    "add adding subtract subtracting combine check verify compute calculate count write look think "
    "means gives leaves makes equals becomes stays matches remains keeps shows tells seems "
    "positive negative larger smaller bigger same different correct wrong careful simple easy "
    "left right side part whole half mistake error reason way method approach idea point case"
).split()


def _clause(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 12))]
    return " ".join(words).capitalize() + rng.choice((".", ",", ";", "?", "!"))


def reasoning_text(rng: random.Random, answer: str, chars: int = COMPLETION_CHARS) -> str:
    """About `chars` characters of plausible step-by-step text ending in an answer tag."""
    parts = [rng.choice(_OPENERS)]
    while sum(len(p) + 1 for p in parts) < chars - 40:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        parts.append(rng.choice(_STEPS).format(a=a, b=b, c=a + rng.choice((b, -b))))
        parts.append(_clause(rng))
    final = answer if rng.random() < 0.5 else str(rng.randint(-20, 20))  # half right, like a learning model
    return " ".join(parts) + f" Therefore the answer is <answer>{final}</answer>"


def build_groups(node_index: int, seed: int, completions: int = COMPLETIONS_PER_GROUP, chars: int = COMPLETION_CHARS):
    """A pool of real QuestionGroups for one node: real problems, scored by the real verifier."""
    from sapo.training.problems.rewards import score_group
    from sapo.training.problems.rollouts import QuestionGroup
    from sapo.training.problems.tasks import TaskSampler, default_task_specs

    rng = random.Random(seed * 1_000 + node_index)
    sampler = TaskSampler(default_task_specs(["basic_arithmetic"]), dataset_seed=seed * 1_000 + node_index, rng_seed=0)
    groups = []
    for problem in sampler.sample(GROUPS_PER_NODE_POOL):
        texts = [reasoning_text(rng, problem.answer, chars) for _ in range(completions)]
        groups.append(QuestionGroup(problem=problem, completions=texts, rewards=score_group(problem, texts)))
    return groups
