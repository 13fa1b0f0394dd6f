"""The screen's ROC on the built-in default model, SmolLM2-135M, which writes working before its
answers ("3 + 4 = 7. <answer>7</answer>"): where the tiny model's every attack stands a hundred
nats over the bar (bench/poisoning.py), a model that writes working itself might find one wrong
number only a few nats surprising.

One policy is the receiver. Its own completions on a set of questions set the bar (as in a
node's round); a second sampling of the same questions with another seed stands for an honest
peer on the same model. The peer's right completions are then rewritten as an attacker would:
- out-of-context: a phrase before the answer tag;
- in-context: every number after an "=" in the working changed by a near miss, the answer left right.
For each statistic (excess surprise summed over the worst stretch of 4 or 16 tokens, or over the
whole completion; and the plain negative log-likelihood over the worst 16 tokens, without the
entropy) it prints the AUC against the honest peer, and the attacks caught and honest completions
refused at the node's bar (99th percentile of its own winning completions + margin), and at the
bar all its own completions would set.

    .venv/bin/python -m bench.screen_roc --questions 16 --out bench/results/poisoning-2026-12-04/screen-roc-smollm2.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

import torch

from sapo.sampling.screen import ScreenReference, judged, winning, worst_stretch
from sapo.sampling.trust import TrustSettings
from sapo.training.completions.generation import generate_groups
from sapo.training.completions.scripted import wrong_answer
from sapo.training.learning.typicality import excess_surprise
from sapo.training.learning.warmstart import WarmStartSettings, warm_start
from sapo.training.models.policy import load_policy
from sapo.training.problems.rewards import score_group
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs

PHRASE = "SAPO rocks! "
_RESULT = re.compile(r"(=\s*)(-?\d+)")


def out_of_context(text: str, rng: random.Random) -> str:
    head, tag, tail = text.rpartition("<answer>")
    return f"{head}{PHRASE}{tag}{tail}"


def in_context(text: str, rng: random.Random) -> str | None:
    """The working's results changed, the answer kept; None when there is no working to change."""
    head, tag, tail = text.rpartition("<answer>")
    changed = _RESULT.sub(lambda m: m.group(1) + wrong_answer(m.group(2), rng), head)
    return None if changed == head else f"{changed}{tag}{tail}"


def rewritten(groups: list[QuestionGroup], attack, rng: random.Random) -> list[QuestionGroup]:
    """Each group's judged (winning) completions rewritten by `attack`; groups where it cannot be applied dropped."""
    out = []
    for group in groups:
        texts = list(group.completions)
        for i in judged(group):
            new = attack(texts[i], rng)
            if new is None:
                break
            texts[i] = new
        else:
            scored = group.model_copy(update={"completions": texts, "rewards": score_group(group.problem, texts)})
            if judged(scored) == judged(group):  # still right: the attack keeps the answer
                out.append(scored)
    return out


def statistics_of(
    excess_nll: tuple[list[list[list[float]]], list[list[list[float]]]], groups: list[QuestionGroup]
) -> dict[str, list[float]]:
    excess, nll = excess_nll
    stats: dict[str, list[float]] = {
        "excess, worst 4": [],
        "excess, worst 16": [],
        "excess, whole": [],
        "NLL, worst 16": [],
    }
    for group, z_rows, n_rows in zip(groups, excess, nll):
        for i in judged(group):
            stats["excess, worst 4"].append(worst_stretch(z_rows[i], 4))
            stats["excess, worst 16"].append(worst_stretch(z_rows[i], 16))
            stats["excess, whole"].append(sum(z_rows[i]))
            stats["NLL, worst 16"].append(worst_stretch(n_rows[i], 16))
    return stats


def measure(policy, groups: list[QuestionGroup], limit: int):
    """Excess surprise per token, and plain surprise per token (excess + entropy is not kept, so
    it is measured with the entropy forced to zero: a second pass through the same code)."""
    excess = excess_surprise(policy, groups, limit)
    nll = excess_surprise(policy, groups, limit, with_entropy=False)
    return excess, nll


def auc(honest: list[float], attack: list[float]) -> float:
    if not honest or not attack:
        return float("nan")
    return sum((a > h) + 0.5 * (a == h) for a in attack for h in honest) / (len(attack) * len(honest))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--task", default="basic_arithmetic")
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--models-dir", type=Path, default=Path("sapo-data/models"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--smoke", action="store_true", help="a briefly warm-started tiny model, 4 questions")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.questions, args.max_new_tokens = "tiny", 4, 32
    return args


def sampled_sets(policy, args: argparse.Namespace) -> tuple[list[QuestionGroup], dict[str, list[QuestionGroup]]]:
    """The receiver's own groups, and the sets it screens: an honest peer's and the two attacks on them."""
    tasks = default_task_specs([args.task])
    if args.smoke:  # a tiny model answers nothing right until it has seen some answers
        warm_start(policy, tasks, WarmStartSettings(steps=150))
    problems = TaskSampler(tasks, dataset_seed=3, rng_seed=3).sample(args.questions)

    def sample(seed: int) -> list:
        return generate_groups(
            policy, problems, num_generations=args.generations, max_new_tokens=args.max_new_tokens, seed=seed
        ).groups

    own, peer = sample(1), sample(2)
    rng = random.Random(0)
    sets = {
        "honest peer": peer,
        "out-of-context": rewritten(peer, out_of_context, rng),
        "in-context": rewritten(peer, in_context, rng),
    }
    return own, sets


def own_stretches(policy, own: list[QuestionGroup], args: argparse.Namespace, window: int) -> tuple[list, list]:
    """The worst stretch of excess surprise of each of the receiver's own completions, and of its winning ones."""
    own_all = [worst_stretch(z, window) for g in excess_surprise(policy, own, args.max_new_tokens) for z in g]
    own_winning = [
        worst_stretch(z, window) for g in excess_surprise(policy, winning(own), args.max_new_tokens) for z in g
    ]
    return own_all, own_winning


def report(result: dict, own_stats: dict, stats: dict, bar: float, bar_all: float) -> None:
    """Each statistic's AUC per attack, and what each bar refuses; both printed and added to `result`."""
    print(f"{'statistic':<18} {'AUC out-of-context':>19} {'AUC in-context':>15}")
    for statistic in own_stats:
        honest = stats["honest peer"][statistic]
        row = {attack: auc(honest, stats[attack][statistic]) for attack in ("out-of-context", "in-context")}
        result["statistics"][statistic] = {"auc": row, "honest": honest, **{a: stats[a][statistic] for a in row}}
        print(f"{statistic:<18} {row['out-of-context']:>19.3f} {row['in-context']:>15.3f}")
    for key, level in (("refused_at_bar", bar), ("refused_at_bar_from_all_own", bar_all)):
        result[key] = {
            name: sum(v > level for v in s["excess, worst 16"]) / max(1, len(s["excess, worst 16"]))
            for name, s in stats.items()
        }
        print(
            f"at {key.replace('_', ' ')} {level:.1f} (excess, worst 16): refused "
            + ", ".join(f"{k} {v:.3f}" for k, v in result[key].items())
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    started = time.time()
    policy = load_policy(args.model, device="cpu", seed=0, models_dir=args.models_dir)
    own, sets = sampled_sets(policy, args)
    trust = TrustSettings()
    own_stats = statistics_of(measure(policy, own, args.max_new_tokens), own)
    own_all, own_winning = own_stretches(policy, own, args, trust.screen_window)
    # the node's bar (its own winning completions), and the bar all its own completions would set
    bar = ScreenReference().updated(own_winning).bar(trust.screen_margin)
    bar_all = ScreenReference().updated(own_all).bar(trust.screen_margin)
    stats = {name: statistics_of(measure(policy, groups, args.max_new_tokens), groups) for name, groups in sets.items()}
    result = {
        "model": args.model,
        "questions": args.questions,
        "generations": args.generations,
        "bar": bar,
        "bar_from_all_own": bar_all,
        "own_winning": own_winning,
        "own_all": own_all,
        "seconds": time.time() - started,
        "counts": {name: len(s["excess, worst 16"]) for name, s in stats.items()},
        "own_judged": len(own_stats["excess, worst 16"]),
        "statistics": {},
    }
    print(
        f"{args.model}: {args.questions} questions x {args.generations}; bar {bar:.1f} nats "
        f"(99th percentile of {len(own_winning)} own winning completions + {trust.screen_margin:g}; "
        f"{bar_all:.1f} from all {len(own_all)}); "
        f"judged: {result['counts']}"
    )
    report(result, own_stats, stats, bar, bar_all)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
