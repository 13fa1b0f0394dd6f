"""ATTACK (h-attack2, on main c9a18d3): standing's places, as an attacker uses them. Run:

    .venv/bin/python -m tests.hardening.attack_standing_places

The real `Standing` (sampling/standing.py), every author established (three ramps after its first
asked-for group). A place weighs what its best author weighs, shared among its authors:
1. a swarm on one LAN or container network: every honest author is in the one "local" place, so
   20 honest authors weigh one author's worth against an attacker's 3 keys in 3 public /16s;
2. NATed honest authors all sit in their relay's place ("via <relay's /16>", the bootstrap relays
   for most of them); an attacker whose keys are reached through the same relay (a slot on that
   public relay is free, up to its 64) takes a share of that place in proportion to its keys.
"""

from sapo.sampling.standing import Provenance, Standing

T0, RAMPS = 0.0, 3 * 600 + 5


def main() -> None:
    st = Standing()
    honest = [f"h{i}" for i in range(20)]
    attack = [f"a{i}" for i in range(3)]
    for h in honest:
        st.credit(h, T0, Provenance(True, "local"))
    for i, a in enumerate(attack):
        st.credit(a, T0 + 1, Provenance(True, f"150.{i}.0.0/16"))
    now = T0 + RAMPS
    for x in honest + attack:
        st.credit(x, now - 1, Provenance(True, None))
    w = st.weights(honest + attack, now)
    print(
        f"LAN swarm of 20 honest vs 3 keys in 3 public /16s: honest share of the draw {sum(w[h] for h in honest) / sum(w.values()):.1%}"
    )
    for k in (0, 5, 20):
        st = Standing()
        public = [f"p{i}" for i in range(10)]
        nated = [f"n{i}" for i in range(10)]
        attack = [f"a{i}" for i in range(k)]
        for i, p in enumerate(public):
            st.credit(p, T0, Provenance(True, f"{20 + i}.1.0.0/16"))
        for n in nated:
            st.credit(n, T0, Provenance(True, "via 9.9.0.0/16"))
        for a in attack:
            st.credit(a, T0 + 1, Provenance(True, "via 9.9.0.0/16"))
        now = T0 + RAMPS
        w = st.weights(public + nated + attack, now)
        total = sum(w.values())
        print(
            f"{k} attacker keys via the NATed authors' relay: a NATed honest author weighs {w['n0']:.3f} "
            f"(a public one {w['p0']:.3f}); the 10 NATed honest {sum(w[n] for n in nated) / total:.1%} of the draw, "
            f"the attacker {sum(w[a] for a in attack) / total:.1%}"
        )


if __name__ == "__main__":
    main()
