"""h-atk6, question 3: does a trim rule let a stranger's old links pin the node?

A node (watermarks 64/96) holds a stranger's STRANGER links, made first and kept, each from a /16
of its own; honest newcomers, each from a /16 of its own too, arrive 32 every round (a check closes at most 32) and each round
one trim runs: the production rule (the longest-lasting half of LOW kept, then the largest
groups, ties at random), youngest-first among ties (1efb72b's rule, which kept all the
stranger's), and at random. It prints the stranger's share of the links kept after ROUNDS.

    .venv/bin/python -m tests.hardening.trim_pinning
"""

from __future__ import annotations

import json
import random

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from sapo.protocol.reach.connections import (
    LASTED_KEPT_SHARE,
    MAX_CLOSED_PER_CHECK,
    _from_the_largest_groups,
    _past_the_longest_lasting,
)

LOW, HIGH = 64, 96
STRANGER, ROUNDS, ARRIVING = 64, 20, 32


def peer() -> ID:
    return ID.from_pubkey(create_new_key_pair().public_key)


def at_random(candidates: list[tuple[ID, str, float]], need: int) -> list[ID]:
    """The rule before 1efb72b: from the largest group, at random (every group here holds one)."""
    return [p for p, _, _ in random.sample(candidates, min(need, len(candidates)))]


def production(candidates: list[tuple[ID, str, float]], need: int) -> list[ID]:
    return _from_the_largest_groups(_past_the_longest_lasting(candidates, int(LOW * LASTED_KEPT_SHARE)), need)


def youngest_first(candidates: list[tuple[ID, str, float]], need: int) -> list[ID]:
    """1efb72b's rule: every group here holds one, so the youngest links go first."""
    return [p for p, _, _ in sorted(candidates, key=lambda c: c[2])[:need]]


def run(trim) -> dict[str, int]:
    stranger = {peer(): 10_000.0 for _ in range(STRANGER)}  # seconds lasted
    links = dict(stranger)
    group = {p: f"11.{i // 256}.{i % 256}" for i, p in enumerate(links)}
    for round_ in range(ROUNDS):
        for p in links:
            links[p] += 30.0
        for _ in range(ARRIVING):
            p = peer()
            links[p], group[p] = 30.0, f"12.{round_}.{len(group) % 256}"
        if len(links) > HIGH:
            need = min(len(links) - LOW, MAX_CLOSED_PER_CHECK)
            for p in trim([(p, group[p], age) for p, age in links.items()], need):
                del links[p]
    return {"kept": len(links), "stranger_kept": sum(p in links for p in stranger)}


if __name__ == "__main__":
    print(
        json.dumps({"production": run(production), "youngest_first": run(youngest_first), "at_random": run(at_random)})
    )
