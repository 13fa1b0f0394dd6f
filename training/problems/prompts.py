"""How a question becomes model input. The same text rendering is used for local generation
and for re-encoding peers' completions, so both are trained on identical contexts."""

from __future__ import annotations

from typing import Literal

from sapo.training.problems.tasks import Problem

PromptStyle = Literal["chat", "plain"]


def prompt_style_for(prompt_style: str, tiny: bool) -> PromptStyle:
    """The style a model gets: `auto` means plain for a tiny model, chat otherwise."""
    if prompt_style == "auto":
        return "plain" if tiny else "chat"
    if prompt_style == "chat":
        return "chat"
    if prompt_style == "plain":
        return "plain"
    raise ValueError(f"prompt_style must be auto, chat or plain, not {prompt_style!r}")


# Follows the reference (rl-swarm): the final answer goes inside <answer> tags.
SYSTEM_PROMPT = (
    "You are a helpful assistant that solves problems. Think briefly, then give the final "
    "answer inside <answer> </answer> tags."
)

# SmolLM2-135M never emits the tag zero-shot (0/80). One worked example as an earlier
# user/assistant exchange lifts easy arithmetic at T=1.0 to 69 % tagged and 25 % correct;
# the same example pasted into the system prompt gave 4 % tagged and 0 % correct.
ONE_SHOT = (
    {"role": "user", "content": "Calculate 3 + 4."},
    {"role": "assistant", "content": "3 + 4 = 7. <answer>7</answer>"},
)


def chat_messages(question: str, one_shot: bool) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        *(ONE_SHOT if one_shot else ()),
        {"role": "user", "content": question},
    ]


def render_prompt(problem: Problem, tokenizer, style: PromptStyle, one_shot: bool) -> str:
    """The full text the model continues from.

    `plain` is for the tiny from-scratch models, whose context is better spent on the
    question alone.
    """
    if style == "plain":
        return f"{problem.question}\n"
    return tokenizer.apply_chat_template(
        chat_messages(problem.question, one_shot), tokenize=False, add_generation_prompt=True
    )
