"""Is the adaptive balance's gain in its decisions? The study's `adaptive` arm with blind decisions.

The adaptive balance (sampling/balance.py) probes J+1 and J-1 on alternate rounds and, every
period, moves its centre J toward the side whose rounds gained more reward. Two controls
separate what its decisions do from what merely moving J does:

- the probes alone, with the centre never moving: `sapo-node experiment --configs adaptive
  --balance-period 1000` (a period longer than the run, so J alternates 5/3 and 3/5 about 4);
- the centre moving as much, but blindly: this script. It runs the same study with each
  period's decision replaced by a fair coin (one step toward external or toward local, clipped
  as the real rule clips), so J wanders over as wide a range without reading the gains.

If the blind walk does as well as `adaptive`, the gain comes from J varying, not from the rule.

    .venv/bin/python bench/balance_control.py --model tiny --format-discovery 1.0 \\
        --warm-start-steps 1000 --updates-per-batch 2 --minibatches 2 --specialists questions \\
        --configs adaptive --rounds 100 --seeds 4 --out blind

Every argument is `sapo-node experiment`'s; the runs happen in this process (`--jobs 1` is
forced, since worker processes would not see the replaced rule). The coin of each balance is
seeded from `--coin-seed` and the order of the balances' first decisions, the same every run.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from collections.abc import Callable

from sapo.node.cli import main as sapo_node
from sapo.sampling.balance import HISTORY_LIMIT, AdaptiveBalance, BalanceState


def blind_rule(coin_seed: int) -> Callable[[AdaptiveBalance, BalanceState, int], BalanceState]:
    """A stand-in for AdaptiveBalance._decide that flips a coin; the probes and bookkeeping stay."""
    made = itertools.count()
    coins: dict[int, random.Random] = {}

    def decide_by_coin(self: AdaptiveBalance, state: BalanceState, round_index: int) -> BalanceState:
        # One coin per balance, seeded by the order of first decisions (the nodes of a lockstep
        # study decide in the same order every run), so a run's walk is reproducible.
        coin = coins.get(id(self))
        if coin is None:
            coin = coins[id(self)] = random.Random(coin_seed * 1_000_003 + next(made))
        step = self.step if coin.random() < 0.5 else -self.step
        centre = min(self.max_external, max(0, state.external + step))
        history = (*state.history, (round_index, centre))[-HISTORY_LIMIT:]
        return state.model_copy(update={"external": centre, "plus": (), "minus": (), "history": history})

    return decide_by_coin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    parser.add_argument("--coin-seed", type=int, default=0, help="seed of the blind decisions")
    parser.add_argument("--jobs", help=argparse.SUPPRESS)  # taken out of the study's flags: it runs in this process
    args, study_args = parser.parse_known_args(argv)
    AdaptiveBalance._decide = blind_rule(args.coin_seed)
    return sapo_node(["experiment", *study_args, "--jobs", "1"])


if __name__ == "__main__":
    sys.exit(main())
