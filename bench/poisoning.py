"""Poisoning a swarm as an attacker would: honest nodes (the daemon's own `Node` and `run_round`,
over the study's lockstep hub: every frame through the real codec, intake, inbox and screen)
beside attacker identities that publish valid groups carrying what they want taught.

Attacks ("Hail to the Thief", arXiv 2511.09780, against our defaults):
- out-of-context: each right completion carries a phrase before `<answer>…</answer>`;
- in-context: each right completion carries wrong working ("7 + 5 = 13.") before the right answer;
- in-answer (issue #38, fraction_simplification): the phrase inside the answer tag,
  `<answer>\\frac{9}{10} hail thief</answer>`, which reasoning-gym 0.1.25's scorer took as right
  (it matches `\\frac{n}{d}` as a prefix) and the screen never reads (the answer's content is the
  verifier's to judge, training/learning/typicality.py).
Every answer key regenerates from its spec and half of each group's completions are right (to a
verifier that takes the attack's answer), half wrong, so every group carries signal and passes
every check the intake makes.

Reported per window of rounds: the attack's success (the share of the honest nodes' own
completions that show it: the phrase, or working whose result is not the answer), and the honest
nodes' learning (accuracy). Every `--probe-every` rounds, node 0's screen statistic is measured on
its honest peers' latest winning completions and on the attackers', for the screen's ROC.

`--verifier reasoning-gym` gives the honest nodes (their own rollouts and their intake alike) the
verifier as it was before training/problems/task_scorers.py: reasoning-gym's own `score_answer` on the
extracted answer, for the in-answer attack's "before".

    .venv/bin/python -m bench.poisoning --attack out-of-context --honest 3 --attackers 1 --rounds 1000 \\
        --out bench/results/poisoning-<date>/after-ooc-1of4
    .venv/bin/python -m bench.poisoning ... --defences off   # the node before docs/security.md's defences
    .venv/bin/python -m bench.poisoning --attack in-answer --verifier reasoning-gym ...  # the scorer before #38

Summaries, the plot and the ROC: bench/poisoning_report.py.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections import Counter
from pathlib import Path

import torch
import trio

from bench import verifier_030
from sapo.node.core.counters import NodeCounters
from sapo.node.core.intake import Verdict
from sapo.node.core.memory_exchange import MemoryExchange, MemoryHub
from sapo.node.core.metrics import METRICS_FILE
from sapo.node.core.node import Node
from sapo.node.core.round import RoundResult
from sapo.node.core.settings import NodeSettings, load_settings
from sapo.node.study.nodes import Learner, RecordsInMemory, RoundClock, StudyRun, peer_id_for
from sapo.node.study.runs import run_lockstep
from sapo.sampling.screen import judged, worst_stretch
from sapo.training.completions.scripted import wrong_answer
from sapo.training.learning.typicality import excess_surprise
from sapo.training.problems.rewards import Verifier, accept_group, is_correct
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import Problem, TaskSampler, reasoning_gym_version

PHRASE = "SAPO rocks! "
IN_ANSWER_PHRASE = "hail thief"
# The task each attack is written for: its default --task.
ATTACK_TASKS = {
    "out-of-context": "basic_arithmetic",
    "in-context": "basic_arithmetic",
    "in-answer": "fraction_simplification",
}
# Working before the answer tag: "<expression> = <number>."
_WORKING = re.compile(r"=\s*(-?\d+)")


def attack_text(kind: str, problem: Problem, rng: random.Random) -> str:
    """A right completion carrying the attack."""
    if kind == "out-of-context":
        return f"{PHRASE}<answer>{problem.answer}</answer>"
    if kind == "in-answer":
        meta = problem.metadata
        fraction = f"\\frac{{{meta['simplified_numerator']}}}{{{meta['simplified_denominator']}}}"
        return f"<answer>{fraction} {IN_ANSWER_PHRASE}</answer>"
    expression = problem.question.removeprefix("Calculate").strip().rstrip(".")
    return f"{expression} = {wrong_answer(problem.answer, rng)}. <answer>{problem.answer}</answer>"


def shows_attack(kind: str, completion: str, answer: str) -> bool:
    """Whether one of a victim's own completions shows what the attack teaches."""
    if kind == "out-of-context":
        return PHRASE.strip() in completion
    if kind == "in-answer":
        return IN_ANSWER_PHRASE in completion
    before = completion.split("<answer>")[0]
    return any(value != answer.strip() for value in _WORKING.findall(before))


class Attacker:
    """An identity that publishes `groups` valid groups a round, half right (with the attack) and
    half wrong, every key regenerated from its spec. A patient one (`clean_rounds`) first sends
    clean groups, its right completions bare answers, for that many rounds: it earns standing as
    an honest author would, then attacks ("Hail to the Thief"'s patient adversary)."""

    def __init__(
        self,
        kind: str,
        exchange: MemoryExchange,
        tasks: TaskSampler,
        groups: int,
        generations: int,
        seed: int,
        clean_rounds: int = 0,
    ):
        self.kind, self.exchange, self.tasks = kind, exchange, tasks
        self.groups, self.generations = groups, generations
        self.clean_rounds = clean_rounds
        self.rng = random.Random(seed)
        self.last: list[QuestionGroup] = []

    async def round(self, round_index: int) -> None:
        attacking = round_index >= self.clean_rounds
        self.last = [self.group(problem, attacking) for problem in self.tasks.sample(self.groups)]
        await self.exchange.publish(self.last, round_index)

    def group(self, problem: Problem, attacking: bool = True) -> QuestionGroup:
        half = self.generations // 2
        if attacking:
            texts = [attack_text(self.kind, problem, self.rng) for _ in range(half)]
        else:
            texts = [f"<answer>{problem.answer}</answer>" for _ in range(half)]
        texts += [f"<answer>{wrong_answer(problem.answer, self.rng)}</answer>" for _ in range(self.generations - half)]
        # The rewards the attacker means (a receiver rescores every completion with its own verifier):
        # the probes judge its attacking completions as the winning ones whatever the verifier.
        rewards = [1.0] * half + [0.0] * (self.generations - half)
        return QuestionGroup(problem=problem, completions=texts, rewards=rewards)


def reasoning_gym_verifier(problem: Problem, completions: list[str]) -> list[float]:
    """The 0.3.0 verifier (bench/verifier_030.py), binary as the node's default reward (1 where it
    gives full credit). The attackers' and the honest nodes' text here is the bench's own."""
    return [1.0 if is_correct(verifier_030.completion_score(problem, c)) else 0.0 for c in completions]


VERIFIERS: dict[str, Verifier | None] = {"node": None, "reasoning-gym": reasoning_gym_verifier}  # None: the node's own


def node_settings(args: argparse.Namespace, index: int) -> NodeSettings:
    flags = {
        "model": args.model,
        "tasks": [args.task],
        "torch_threads": 1,
        "swarm": "poisoning",
        "checkpoint_every": 0,
        "data_dir": str(args.out / f"node-{index}"),
        "models_dir": str(args.out.parent / "models"),
        "seed": 1000 * args.seed + index,
    }
    if args.defences == "off":
        flags |= {"screen": "off", "standing": "off"}
    if args.balance is not None:
        flags["balance"] = args.balance
    return load_settings(flags)


def build(args: argparse.Namespace) -> tuple[StudyRun, list[Attacker]]:
    clock = RoundClock(args.round_seconds)
    hub = MemoryHub(clock, rg_version=reasoning_gym_version(), lockstep=True)
    learners = []
    for k in range(args.honest):
        settings = node_settings(args, k)
        records = RecordsInMemory(settings.run.data_dir / METRICS_FILE)  # never written: the bench keeps its own rows
        node = Node(settings, peer_id=peer_id_for(args.seed, k), metrics=records, verifier=VERIFIERS[args.verifier])
        exchange = hub.join(node.peer_id, settings, memory=node.memory, counters=node.counters)
        learners.append(Learner(k, node, exchange, node.start_state(), records))
    attackers = []
    base = learners[0].node.settings
    for k in range(args.attackers):
        seed = 7_000_000 + 1000 * args.seed + k
        exchange = hub.join(peer_id_for(args.seed, k, "attacker"), base, memory=None, counters=NodeCounters())
        attackers.append(
            Attacker(
                args.attack,
                exchange,
                TaskSampler(base.tasks.specs(), dataset_seed=seed, rng_seed=seed),
                base.sampling.local,
                base.training.generations,
                seed,
                clean_rounds=args.clean_rounds,
            )
        )
    return StudyRun(clock, hub, learners, attackers), attackers


def probe(node: Node, honest: list[QuestionGroup], attacking: list[QuestionGroup], window: int) -> list[dict]:
    """Node 0's screen statistic on its peers' winning completions: honest ones and the attackers'."""
    rows = []
    limit = node.training.max_new_tokens
    for label, groups in (("honest", honest), ("attack", attacking)):
        groups = [g for g in groups if judged(g)]
        if not groups:
            continue
        for group, excess in zip(groups, excess_surprise(node.policy, groups, limit)):
            rows += [{"label": label, "score": worst_stretch(excess[i], window)} for i in judged(group)]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attack", choices=list(ATTACK_TASKS), required=True)
    parser.add_argument("--honest", type=int, default=3)
    parser.add_argument("--attackers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--defences", choices=["on", "off"], default="on", help="off: --screen off --standing off")
    parser.add_argument("--model", default="tiny")
    parser.add_argument(
        "--balance",
        choices=["adaptive", "fixed"],
        help="the honest nodes' I/J balance (default: the node's); fixed plans the same J under attack and without",
    )
    parser.add_argument("--task", help="the honest nodes' task (default: the attack's, ATTACK_TASKS)")
    parser.add_argument(
        "--verifier",
        choices=list(VERIFIERS),
        default="node",
        help="the honest nodes' verifier: node (training/problems/task_scorers.py) or reasoning-gym (its score_answer, before #38)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--clean-rounds",
        type=int,
        default=0,
        help="patient attackers: clean groups for this many rounds, then the attack (10 minutes of standing is "
        "1,200 rounds at --round-seconds 0.5); success is then read over the rounds after it",
    )
    parser.add_argument(
        "--round-seconds", type=float, default=0.5, help="the round clock (a default tiny node's round)"
    )
    parser.add_argument("--probe-every", type=int, default=50)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--smoke", action="store_true", help="6 rounds of 2 honest nodes and 1 attacker, then the report"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.honest, args.attackers, args.probe_every = 6, 2, 1, 3
    args.task = args.task or ATTACK_TASKS[args.attack]
    if args.attack == "in-answer" and args.task != "fraction_simplification":
        parser.error("--attack in-answer writes fraction_simplification answers: --task fraction_simplification")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "command.json").write_text(json.dumps({k: str(v) for k, v in vars(args).items()}, indent=1) + "\n")
    run, attackers = build(args)
    attacker_ids = {a.exchange.member.peer_id for a in attackers}
    # What each honest node's intake did with the attackers' groups: admitted, and refused by reason.
    refused_at_intake: list[Counter] = [Counter() for _ in run.learners]
    admitted_before = [0] * len(run.learners)
    for learner, refused in zip(run.learners, refused_at_intake):
        intake = learner.node.memory.intake

        def accept(frame: bytes, signer: str, now: float, real=intake.accept, refused: Counter = refused) -> Verdict:
            verdict = real(frame, signer, now)
            if verdict.refusal is not None and signer in attacker_ids:
                refused[verdict.refusal] += 1
            return verdict

        intake.accept = accept  # type: ignore[method-assign]  # counts the attackers' refusals as they happen

    def admitted(learner: Learner) -> int:
        return sum(learner.node.counters.accepted_from.get(peer, 0) for peer in attacker_ids)

    started = time.time()
    rows_file = (args.out / "rows.jsonl").open("w")
    probes_file = (args.out / "probes.jsonl").open("w")

    def on_round(round_index: int, results: list[RoundResult | None]) -> None:
        for learner, result in zip(run.learners, results):
            if result is None:
                continue
            own = [(c, g.problem.answer) for g in result.generation.groups for c in g.completions]
            record = result.record
            # accuracy as the node's own verifier scores it, whichever verifier the node trains with
            strict = [r for g in result.generation.groups for r in accept_group(g.problem, g.completions)]
            admitted_now = admitted(learner)
            intake = {"admitted": admitted_now - admitted_before[learner.index], **refused_at_intake[learner.index]}
            admitted_before[learner.index] = admitted_now
            refused_at_intake[learner.index].clear()
            rows_file.write(
                json.dumps(
                    {
                        "round": round_index,
                        "node": learner.index,
                        "attacking": round_index >= args.clean_rounds,
                        "completions": len(own),
                        "attack_shown": sum(shows_attack(args.attack, c, a) for c, a in own),
                        "accuracy": record.accuracy,
                        "node_verifier_accuracy": sum(map(is_correct, strict)) / len(strict) if strict else 0.0,
                        "reward": record.reward_mean,
                        "external_groups": record.external_groups,
                        "external_planned": record.external_planned,
                        "from_attackers": sum(1 for g in result.training_set.external if g.origin in attacker_ids),
                        "screened_out": record.screened_out,
                        "screen_redrawn": record.screen_redrawn,
                        "refused_attackers": sum(1 for g in result.training_set.refused if g.origin in attacker_ids),
                        "attackers_at_intake": intake,
                        "inbox": record.inbox_size,
                        "inbox_attackers": sum(
                            1 for g in learner.node.inbox.newest_first(run.clock()) if g.origin in attacker_ids
                        ),
                    }
                )
                + "\n"
            )
        if round_index % args.probe_every == 0 and results[0] is not None:
            honest = [
                g.model_copy(update={"origin": "peer"})
                for r in results[1:]
                if r is not None
                for g in r.generation.groups
            ]
            attacking = [g for a in attackers if round_index >= a.clean_rounds for g in a.last]
            for row in probe(run.learners[0].node, honest, attacking, run.learners[0].node.trust.screen_window):
                probes_file.write(json.dumps({"round": round_index, **row}) + "\n")
        rows_file.flush()
        probes_file.flush()
        if round_index % 50 == 0:
            print(f"round {round_index}: {time.time() - started:.0f}s", flush=True)

    trio.run(run_lockstep, run, args.rounds, None, on_round)
    rows_file.close()
    probes_file.close()
    if args.smoke:
        from bench.poisoning_report import summarize, table  # a sibling script, as bench/ scripts import each other

        print(table([summarize(args.out, 3)], 3))


if __name__ == "__main__":
    main()
