"""ATTACK (h-atk8, on main faf9d0b): keys aged in a shared place escape the recent cap when they
leave it.

Standing's clock runs from an author's first asked-for group, wherever it was placed, and a place
"once known stays until another is seen" (sampling/standing.py `credit`). The recent cap looks
only at that clock (`_recent`: started within the last two ramps). So an attacker ages many keys
where together they weigh one author, then moves each one out:

1. each key poses as an older release (identify without `/sapo/groups/1`) and has one group
   taken on the rollouts topic: credited by right, its clock starts, and it sits in
   OLDER_RELEASES_PLACE with every other such key (one author's weight together). Any shared
   place does as well: keys minted behind one /16 or one relay, fetched there once each;
2. a week later at most (IDLE_SECONDS), each key reconnects as this release from a /16 of its own,
   and is drawn by the fetcher like any author (the draw is network group first, so 20 /16s are
   drawn like 20 honest authors). Its first fetched group moves it to its own /16, and its clock
   is already past two ramps: it weighs a full established author at once, outside the cap.

Before the defence, 20 pre-aged keys fetched in the last 10 minutes left the 31 honest authors
60.8 % (the cap promises 83.3 %). The defence (`Standing.credit`): an author that moves to
another place counts among the recent authors for a ramp, its standing kept, so keys that leave a
shared place together arrive as a cohort and the cap weighs them as one.
"""

import pytest

from sapo.sampling.standing import OLDER_RELEASES_PLACE, RECENT_SHARE, Provenance, Standing

T0 = 1_700_000_000.0
NOW = T0 + 3600
HONEST = [f"honest-{k}" for k in range(31)]  # issue #42's real run: 31 authors a node
KEYS = [f"aged-{k}" for k in range(20)]


def swarm() -> Standing:
    standing = Standing(ramp_seconds=600, newcomer_share=0.1)
    for k, author in enumerate(HONEST):
        standing.credit(author, NOW - 3600, Provenance(place=f"203.{k}.0.0/16"))
    return standing


def honest_share(weights: dict[str, float]) -> float:
    return sum(weights[a] for a in HONEST) / sum(weights.values())


@pytest.mark.parametrize("aged_in", [OLDER_RELEASES_PLACE, "198.51.0.0/16"])
def test_keys_aged_in_a_shared_place_are_capped_when_they_move_out(aged_in):
    standing = swarm()
    for author in KEYS:  # an hour ago, each key's one group, all in one place
        standing.credit(author, NOW - 3600, Provenance(place=aged_in))
    while_aging = standing.weights(HONEST + KEYS, NOW - 700)
    assert sum(while_aging[a] for a in KEYS) == pytest.approx(1.0)  # one author together, as meant
    for k, author in enumerate(KEYS):  # each fetched once within the last 10 minutes, from its own /16
        standing.credit(author, NOW - 600 * k / 20, Provenance(place=f"100.{k}.0.0/16"))
    weights = standing.weights(HONEST + KEYS, NOW)
    # what 20 keys that arrived in the last 10 minutes may weigh (the cap's promise, 83.3 %) ...
    assert sum(weights[a] for a in KEYS) <= RECENT_SHARE * len(HONEST) + 1e-9
    # ... where without the defence they weighed 20 established authors: 31 / 51 = 60.8 %
    assert honest_share(weights) >= 1 / (1 + RECENT_SHARE) - 1e-9
