"""How a question becomes model input. The same text rendering is used for local generation
and for re-encoding peers' completions, so both are trained on identical contexts."""

from __future__ import annotations

from typing import Literal

from sapo.training.tasks import Problem

PromptStyle = Literal["chat", "plain"]

# Follows the reference (rl-swarm): the final answer goes inside <answer> tags.
SYSTEM_PROMPT = (
    "You are a helpful assistant that solves problems. Think briefly, then give the final "
    "answer inside <answer> </answer> tags, for example <answer>42</answer>."
)

# SmolLM2-135M never emits the tag zero-shot (0/80); one worked example lifts easy arithmetic
# to 5-19 % correct, which is enough signal for GRPO to start from.
ONE_SHOT_EXAMPLE = (
    "\n\nExample:\nQuestion: Calculate 3 + 4.\nAnswer: 3 + 4 = 7. <answer>7</answer>"
)


def system_prompt(one_shot: bool) -> str:
    return SYSTEM_PROMPT + (ONE_SHOT_EXAMPLE if one_shot else "")


def render_prompt(problem: Problem, tokenizer, style: PromptStyle, one_shot: bool) -> str:
    """The full text the model continues from.

    `plain` is for the tiny from-scratch models, which have no chat template and whose
    context is better spent on the question alone.
    """
    if style == "plain":
        return f"{problem.question}\n"
    messages = [
        {"role": "system", "content": system_prompt(one_shot)},
        {"role": "user", "content": problem.question},
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
