"""ATTACK (h-atk8, on main faf9d0b): issue #42's honest share at other swarm sizes. Run:

    .venv/bin/python -m tests.hardening.attack8_standing_table

The real `Standing` with simulated time, weighed over every author (as bench/standing_sim.py and
tests/sampling/test_standing.py weigh): h honest authors, each in a /16 of its own, established an
hour ago, against 20 pushers posing as older releases (a group a minute for the hour), 20 late keys
(each in a /16 of its own, clocks started 0-10 minutes ago; and 10 minutes on, established but
recent), both, and 20 keys pre-aged as older releases an hour ago then fetched once each from
/16s of their own in the last 10 minutes (tests/hardening/test_attack8_preaged_keys.py).
"""

from sapo.sampling.standing import OLDER_RELEASES_PLACE, RECENT_SHARE, Provenance, Standing

T0 = 1_700_000_000.0
NOW = T0 + 3600


def swarm(h: int) -> tuple[Standing, list[str]]:
    standing = Standing(ramp_seconds=600, newcomer_share=0.1)
    honest = [f"h{k}" for k in range(h)]
    for k, author in enumerate(honest):
        standing.credit(author, T0, Provenance(place=f"203.{k}.0.0/16"))
    return standing, honest


def share(standing: Standing, honest: list[str], attackers: list[str], now: float = NOW) -> float:
    weights = standing.weights(honest + attackers, now)
    return sum(weights[a] for a in honest) / sum(weights.values())


def pushers(standing: Standing) -> list[str]:
    keys = [f"p{k}" for k in range(20)]
    for author in keys:
        for minute in range(60):
            standing.credit(author, T0 + 60 * minute, Provenance(place=OLDER_RELEASES_PLACE))
    return keys


def late(standing: Standing) -> list[str]:
    keys = [f"late{k}" for k in range(20)]
    for k, author in enumerate(keys):
        standing.credit(author, NOW - 600 * k / 20, Provenance(place=f"198.{k}.0.0/16"))
    return keys


def preaged(standing: Standing) -> list[str]:
    keys = [f"aged{k}" for k in range(20)]
    for author in keys:  # posing as older releases an hour ago: one place, one author's weight together
        standing.credit(author, T0, Provenance(place=OLDER_RELEASES_PLACE))
    for k, author in enumerate(keys):  # then fetched once each, from a /16 of its own
        standing.credit(author, NOW - 600 * k / 20, Provenance(place=f"198.{k}.0.0/16"))
    return keys


def main() -> None:
    print(f"{'h':>4} {'cap':>5} {'pushers':>8} {'late':>7} {'late+10m':>8} {'both':>7} {'pre-aged':>8}")
    for h in (1, 2, 3, 4, 5, 8, 31, 32, 256):
        cap = max(1.0, RECENT_SHARE * h)
        standing, honest = swarm(h)
        against_pushers = share(standing, honest, pushers(standing))
        standing, honest = swarm(h)
        keys = late(standing)
        against_late, ten_minutes_on = share(standing, honest, keys), share(standing, honest, keys, NOW + 600)
        standing, honest = swarm(h)
        against_both = share(standing, honest, pushers(standing) + late(standing))
        standing, honest = swarm(h)
        against_aged = share(standing, honest, preaged(standing))
        row = [against_pushers, against_late, ten_minutes_on, against_both, against_aged]
        print(f"{h:>4} {cap:>5.1f} " + " ".join(f"{100 * x:>7.1f}%" for x in row))


if __name__ == "__main__":
    main()
