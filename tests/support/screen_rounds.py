"""What the screen attack tests and tests/screen_attacks/redraw_cost.py share: peers' groups (honest, poisoned,
heavy), a node holding them in its inbox, and one round's draw and screen."""

from __future__ import annotations

import random
from pathlib import Path

from sapo.node.core.node import Node, Screening
from sapo.node.core.settings import load_settings
from sapo.node.core.state import NodeState
from sapo.sampling.standing import Provenance
from sapo.training.completions.generation import GenerationResult
from sapo.training.problems.rewards import score_group
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import Problem

NOW = 3600.0  # an hour after every author's first group: all of them established
WORDS = "alpha beta gamma delta thief hail rocks sapo zeta omega lambda kappa".split()


def group(problem: Problem, author: str, phrase: str = "") -> QuestionGroup:
    """G = 8: 4 right answers, `phrase` before each, and 4 wrong ones (a warm-started tiny node's shape)."""
    texts = [f"{phrase}<answer>{problem.answer}</answer>"] * 4 + [f"<answer>{int(problem.answer) + 1}</answer>"] * 4
    return QuestionGroup(problem=problem, completions=texts, rewards=score_group(problem, texts), origin=author)


def heavy(problem: Problem, author: str, rng: random.Random) -> QuestionGroup:
    """The heaviest group the intake passes: 64 completions (the codec's limit) of ~3.9 KB (the
    whole under the 256 KiB payload cap), 63 right (63 winners the screen measures), 1 wrong."""

    def junk(chars: int) -> str:
        out: list[str] = []
        while sum(len(w) + 1 for w in out) < chars:
            out.append(rng.choice(WORDS) + str(rng.randrange(1000)))
        return " ".join(out)

    texts = [f"{junk(3900)} <answer>{problem.answer}</answer>" for _ in range(63)]
    texts.append(f"<answer>{int(problem.answer) + 1}</answer>")
    return QuestionGroup(problem=problem, completions=texts, rewards=score_group(problem, texts), origin=author)


def node_holding(policy, inbox: list[QuestionGroup], data_dir: Path, max_new_tokens: int = 32, j: int = 4) -> Node:
    """A node on `policy` (J = `j`, fixed balance) whose inbox holds `inbox`, every author
    credited at time 0, each in a /16 of its own."""
    settings = load_settings(
        {
            "model": "tiny",
            "tasks": ["basic_arithmetic"],
            "data_dir": str(data_dir),
            "max_new_tokens": max_new_tokens,
            "local": 2,
            "external": j,
            "balance": "fixed",
        }
    )
    node = Node(settings, peer_id="me", policy=policy)
    for k, author in enumerate(sorted({g.origin for g in inbox})):
        node.inbox.standing.credit(author, 0.0, Provenance(place=f"203.{k}.0.0/16"))
    for g in inbox:
        node.inbox.add(g, NOW)
    return node


def one_round(node: Node, state: NodeState, own: list[QuestionGroup]) -> Screening:
    """The round's draw, taken out of the inbox, and its screen (with its redraws), as run_round does."""
    plan = node.plan(state)
    selection = node.mix(plan, state, NOW)
    node.inbox.take(selection.external)
    return node.screen(plan, GenerationResult(own, 0.0, 0), selection, state, NOW)


def texts(groups: list[QuestionGroup]) -> list[tuple[str, str]]:
    return [(g.origin, g.problem.question) for g in groups]
