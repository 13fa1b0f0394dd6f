"""ATTACK (h-atk8): run `.venv/bin/python -m tests.hardening.attack8_draw_sim 4 8 32 256` (about 30 s a size).
What the node actually trains on: the real Inbox (node_inbox defaults: 512 groups, 600 s,
a quarter per peer) and the real draw (choose_from_inbox, nonzero-uniform, J=4), with standing
credited as the exchange credits it. h honest authors (own /16 each, established an hour ago),
fetched 3 authors x 2 groups a round from a network-group-first draw; attackers:
 pushers: 20 keys posing as older releases, a group a minute each (one place);
 late:    20 keys in 20 /16s that joined the fetch draw 10 minutes before the end.
Measured: the share of trained external groups by honest authors over the last 10 minutes,
and the honest share of the weights over the draw's candidates (what the draw uses) vs over
every author (what the benches and tests report)."""

import random
import sys

from sapo.node.core.node import choose_from_inbox, node_inbox
from sapo.node.core.settings import load_settings
from sapo.sampling.standing import OLDER_RELEASES_PLACE, Provenance
from sapo.sampling.strategies import SamplerState
from sapo.training.problems.rewards import score_group
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs

ROUND = 26.0
T0 = 1_700_000_000.0
POOL = []
for problem in TaskSampler(default_task_specs(["basic_arithmetic"]), 1, 1).sample(400):
    texts = [f"<answer>{problem.answer}</answer>", "<answer>x</answer>"]
    POOL.append(QuestionGroup(problem=problem, completions=texts, rewards=score_group(problem, texts)))


def group(author, rng):
    return rng.choice(POOL).model_copy(update={"origin": author})


def run(h, scenario, seed, preaged=False):
    rng = random.Random(seed)
    settings = load_settings({"model": "tiny", "tasks": ["basic_arithmetic"]})
    inbox = node_inbox(settings)
    st = inbox.standing
    honest = [f"h{k}" for k in range(h)]
    for k, a in enumerate(honest):
        st.credit(a, T0 - 3600, Provenance(place=f"203.{k}.0.0/16"))
    pushers = [f"p{k}" for k in range(20)] if "pushers" in scenario else []
    late = [f"l{k}" for k in range(20)] if "late" in scenario else []
    if preaged:
        for a in late:
            st.credit(a, T0 - 3600, Provenance(place=OLDER_RELEASES_PLACE))
    state = SamplerState()
    trained = {"h": 0, "a": 0}
    t, end = T0, T0 + 3600
    next_push = {a: T0 + 60 * rng.random() for a in pushers}
    cand_share = []
    while t < end:
        for a, when in list(next_push.items()):
            while when <= t:
                g = group(a, rng)
                st.credit(a, when, Provenance(place=OLDER_RELEASES_PLACE))
                inbox.add(g, when)
                when += 60
            next_push[a] = when
        drawable = honest + (late if t >= end - 600 else [])
        for a in rng.sample(drawable, 3):
            place = f"198.{a[1:]}.0.0/16" if a.startswith("l") else None
            for _ in range(2):
                g = group(a, rng)
                st.credit(a, t, Provenance(place=place) if place else Provenance())
                inbox.add(g, t)
        chosen, state = choose_from_inbox(inbox, settings.external_use, 4, rng, state, t)
        inbox.take(chosen)
        if t >= end - 600:
            for g in chosen:
                trained["h" if g.origin.startswith("h") else "a"] += 1
            cands = {g.origin for g in inbox.newest_first(t)}
            w = st.weights(cands, t)
            cand_share.append(sum(v for a, v in w.items() if a.startswith("h")) / sum(w.values()))
        t += ROUND
    w = st.weights(honest + pushers + late, end)
    all_w = sum(v for a, v in w.items() if a.startswith("h")) / sum(w.values())
    return trained["h"] / (trained["h"] + trained["a"]), sum(cand_share) / len(cand_share), all_w


print(f"{'h':>4} {'scenario':>22} {'trained honest':>15} {'weight/candidates':>18} {'weight/all':>11}")
for h in [int(x) for x in sys.argv[1:]] or [4, 8, 32]:
    for scenario, pre in (("pushers", False), ("late", False), ("pushers+late", False), ("late", True)):
        rows = [run(h, scenario, s, pre) for s in range(3)]
        m = [sum(r[i] for r in rows) / len(rows) for i in range(3)]
        name = scenario + (" (pre-aged)" if pre else "")
        print(f"{h:>4} {name:>22} {100 * m[0]:>14.1f}% {100 * m[1]:>17.1f}% {100 * m[2]:>10.1f}%")
