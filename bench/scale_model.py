"""The scale benchmark's cost model (bench/scale.py): fit to the real runs, extrapolated to 10,000.

A planning tool, not part of the node. A node's cost per second at make run's pace is

    idle per second  +  one round's cost / PACE_ROUND_S

- idle per second = i0 + i1 x links (heartbeats, discovery, keep-alives), fitted on the idle
  phases of every run;
- gossip round = c_group x groups delivered (every other node's: G x (N - 1)), where c_group is
  one delivered group with its mesh duplicates and IHAVE/IWANT, fitted on the gossip runs;
- fetch round = c_req x requests + c_dial x dials, fitted on the fetch runs. Requests a round
  are the want's authors (each asked for GROUPS_PER_AUTHOR groups) and its retries, measured
  on the runs in which every node got its J groups (a starved run's failed retries are the
  bench's limit, not a node's); a drawn author needs a dial unless we hold a link to it, so
  dials = requests x (1 - links / pool), the pool being everyone we know: the other N - 1 nodes
  up to discovery's table (max_tracked_peers) plus our links; and a want dials at most as many
  authors as it wants groups (group_fetch.py).

CPU and inbound bytes each have their own coefficients, from the raw rows alone (least squares,
no intercept). Validation: each real run is predicted from a fit to the other sizes of its mode
(leave one size out), with the event counts from the rules above, not from the run itself.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from sapo.protocol.exchange.group_fetch import GROUPS_PER_AUTHOR

PACE_ROUND_S = 10.0  # make run: about 2 groups per node every 10 s
TABLE_MAX = 256  # NetworkSettings.max_tracked_peers's default: discovery's records
RECORDS_PER_ASK = 15  # peer_records.RECORDS_PER_RESPONSE: what one discovery ask brings
DISCOVERY_INTERVAL_S = 10.0  # NetworkSettings.discovery_interval_seconds's default
SIMULATED = (1_000, 10_000)
# A run whose process used or waited for this much of its one core (the GIL), or whose nodes got
# under one group a round, is left out of the fit: its timeouts cascade into retries and more dials
# (docs/bench/scale.md, "The bench's own limit"), so it measures the bench's limit, not a node.
SATURATED = 0.8
# Runs whose nodes got their J groups in at least this share of rounds give the model its
# requests a round.
HEALTHY = 0.95


@dataclass(frozen=True)
class RunMetrics:
    """One real run, per node: costs per second and per round, and the round's events."""

    mode: str
    nodes: int
    round_s: float
    idle_cpu: float  # cores
    idle_rx: float  # bytes/s
    idle_links: float
    round_cpu: float  # CPU s per round beyond idle
    round_rx: float  # bytes per round beyond idle
    delivered: float  # groups delivered per round (gossip: with no duplicate; fetch: fetched)
    requests: float
    dials: float
    links: float  # at the end of the rounds
    known: float
    pace_cpu: float  # cores at make run's pace
    pace_rx: float  # bytes/s at make run's pace
    coverage: float  # share of (node, round) with >= J new external groups
    authors: float  # distinct authors a node heard over the measured rounds
    groups_per_round: float
    groups_per_author: int  # what the fetcher asked of each author (1 under gossip)
    rounds: int
    load: float
    cores: float  # the whole process's CPU over the rounds: near 1.0 it was saturated (one GIL)
    # CPU and the time it waited for a core, over the rounds (rows from before it was recorded:
    # CPU alone): what the swarm asked of the machine, though a busy machine gave it less
    wanted: float


def melted(run: RunMetrics) -> bool:
    return run.wanted >= SATURATED or run.delivered < 1.0


def run_metrics(row: dict, j: int) -> RunMetrics:
    plan, result = row["plan"], row["result"]
    n, idle, active = plan["nodes"], result["idle"], result["active"]
    idle_cpu = idle["cpu_s"] / idle["wall"] / n
    idle_rx = idle["rx_bytes"] / idle["wall"] / n
    rounds_in = active["wall"] / plan["round_s"]  # node-rounds in the window, per node
    counters = active["counters"]
    round_cpu = ((active["cpu_s"] - active["build_cpu_s"]) / active["wall"] / n - idle_cpu) * plan["round_s"]
    round_rx = (active["rx_bytes"] / active["wall"] / n - idle_rx) * plan["round_s"]
    # Entry k is what arrived between a node's rounds W+k and W+k+1 (its want of round W+k, or
    # under gossip what others published meanwhile). The last one runs to the node's own end of
    # rounds, after which nodes earlier in the phase order publish no more: under gossip it is
    # partial, so it is left out.
    new = [count for node in result["new_per_round"] for count in (node[:-1] if plan["mode"] == "gossip" else node)]
    per_round = sum(new) / max(1, len(new))
    return RunMetrics(
        mode=plan["mode"],
        nodes=n,
        round_s=plan["round_s"],
        idle_cpu=idle_cpu,
        idle_rx=idle_rx,
        idle_links=mean(idle["links"]),
        round_cpu=round_cpu,
        round_rx=round_rx,
        delivered=active["delivered"] / n / rounds_in,
        requests=counters.get("fetch_requests", 0) / n / rounds_in,
        dials=counters.get("fetch_dials", 0) / n / rounds_in,
        links=mean(active["links"]),
        known=mean(active["known"]),
        pace_cpu=idle_cpu + round_cpu / PACE_ROUND_S,
        pace_rx=idle_rx + round_rx / PACE_ROUND_S,
        coverage=sum(count >= j for count in new) / max(1, len(new)),
        authors=mean(result["authors"]),
        groups_per_round=per_round,
        groups_per_author=plan.get("groups_per_author", 1),
        rounds=plan["rounds"],
        load=max(row["load_before"], row["load_after"]),
        cores=active["cpu_s"] / active["wall"],
        wanted=(active["cpu_s"] + active.get("waited_s", 0.0)) / active["wall"],
    )


def mean(values: list) -> float:
    return sum(values) / len(values) if values else 0.0


def least_squares(xs: list[list[float]], ys: list[float]) -> list[float]:
    """Coefficients b minimising sum (y - b.x)^2, no intercept (normal equations, k <= 3)."""
    k = len(xs[0])
    a = [[sum(x[i] * x[j] for x in xs) for j in range(k)] for i in range(k)]
    b = [sum(x[i] * y for x, y in zip(xs, ys)) for i in range(k)]
    for col in range(k):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, k), key=lambda r: abs(a[r][col]))
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        if abs(a[col][col]) < 1e-18:
            return [0.0] * k
        for r in range(k):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [v - f * w for v, w in zip(a[r], a[col])]
                b[r] -= f * b[col]
    return [b[i] / a[i][i] for i in range(k)]


@dataclass(frozen=True)
class Model:
    """Coefficients fitted on some runs, and the protocol rules' measured inputs."""

    idle_cpu: list[float]  # i0, i1 (per link)
    idle_rx: list[float]
    gossip_cpu: float  # per delivered group
    gossip_rx: float
    fetch_cpu: list[float]  # per request, per dial
    fetch_rx: list[float]
    requests: float  # per round: the want's authors and its retries
    want: int  # groups a node wants a round: also the most authors a want dials
    links_gossip: float  # a node's links, at the largest size fitted
    links_fetch: float
    groups_per_round: int


def fit(runs: list[RunMetrics], groups_per_round: int, want: int) -> Model:
    gossip = [r for r in runs if r.mode == "gossip"]
    fetch = [r for r in runs if r.mode == "fetch"]
    idle_x = [[1.0, r.idle_links] for r in runs]
    idle_cpu, idle_rx = (
        least_squares(idle_x, [r.idle_cpu for r in runs]),
        least_squares(idle_x, [r.idle_rx for r in runs]),
    )
    if min(*idle_cpu, *idle_rx) <= 0:  # too few runs, or links alike in all: per link alone
        idle_cpu = [0.0, *least_squares([[r.idle_links] for r in runs], [r.idle_cpu for r in runs])]
        idle_rx = [0.0, *least_squares([[r.idle_links] for r in runs], [r.idle_rx for r in runs])]
    largest = {
        mode: max((r for r in runs if r.mode == mode), key=lambda r: r.nodes, default=None)
        for mode in ("gossip", "fetch")
    }
    return Model(
        idle_cpu=idle_cpu,
        idle_rx=idle_rx,
        gossip_cpu=least_squares([[r.delivered] for r in gossip], [r.round_cpu for r in gossip])[0] if gossip else 0.0,
        gossip_rx=least_squares([[r.delivered] for r in gossip], [r.round_rx for r in gossip])[0] if gossip else 0.0,
        fetch_cpu=fit_fetch(fetch, [r.round_cpu for r in fetch]),
        fetch_rx=fit_fetch(fetch, [r.round_rx for r in fetch]),
        requests=mean([r.requests for r in fetch if r.coverage >= HEALTHY] or [r.requests for r in fetch]),
        want=want,
        links_gossip=largest["gossip"].links if largest["gossip"] else 0.0,
        links_fetch=largest["fetch"].links if largest["fetch"] else 0.0,
        groups_per_round=groups_per_round,
    )


def fit_fetch(fetch: list[RunMetrics], ys: list[float]) -> list[float]:
    """[per request, per dial], both non-negative (issue #41: the fit used to drop the dial term
    whenever the two-term fit came out negative anywhere, even when it was the request term that
    did, which is the most optimistic choice; a non-negative fit keeps whichever explains the runs)."""
    if not fetch:
        return [0.0, 0.0]
    return nonnegative_least_squares([[r.requests, r.dials] for r in fetch], ys)


def nonnegative_least_squares(xs: list[list[float]], ys: list[float]) -> list[float]:
    """Coefficients b >= 0 minimising sum (y - b.x)^2, no intercept: the least-squares fit on each
    subset of the columns, kept if all its coefficients are non-negative, the best of those (exact
    for the two or three columns here: the optimum is the plain fit on the columns it leaves free)."""
    k = len(xs[0])
    best, best_error = [0.0] * k, sum(y * y for y in ys)
    for mask in range(1, 2**k):
        columns = [i for i in range(k) if mask >> i & 1]
        free = least_squares([[x[i] for i in columns] for x in xs], ys)
        if min(free) < 0:
            continue
        b = [0.0] * k
        for i, value in zip(columns, free):
            b[i] = value
        error = sum((y - sum(bi * xi for bi, xi in zip(b, x))) ** 2 for x, y in zip(xs, ys))
        if error < best_error:
            best, best_error = b, error
    return best


@dataclass(frozen=True)
class Predicted:
    mode: str
    nodes: int
    pace_cpu: float
    pace_rx: float
    delivered: float
    requests: float
    dials: float


def predict(model: Model, mode: str, nodes: int, links: float | None = None) -> Predicted:
    """A node's cost at make run's pace in a swarm of `nodes`, from the rules and coefficients."""
    if mode == "gossip":
        links = model.links_gossip if links is None else links
        delivered, requests, dials = model.groups_per_round * (nodes - 1), 0.0, 0.0
        round_cpu, round_rx = model.gossip_cpu * delivered, model.gossip_rx * delivered
    else:
        links = model.links_fetch if links is None else links
        requests = min(model.requests, float(nodes - 1))
        pool = min(nodes - 1, TABLE_MAX + links)
        dials = min(float(model.want), requests * max(0.0, 1.0 - min(links, nodes - 1) / pool))
        delivered = requests * GROUPS_PER_AUTHOR
        round_cpu = model.fetch_cpu[0] * requests + model.fetch_cpu[1] * dials
        round_rx = model.fetch_rx[0] * requests + model.fetch_rx[1] * dials
    idle_cpu = model.idle_cpu[0] + model.idle_cpu[1] * links
    idle_rx = model.idle_rx[0] + model.idle_rx[1] * links
    return Predicted(
        mode, nodes, idle_cpu + round_cpu / PACE_ROUND_S, idle_rx + round_rx / PACE_ROUND_S, delivered, requests, dials
    )


@dataclass(frozen=True)
class Validation:
    mode: str
    nodes: int
    real_cpu: float
    model_cpu: float
    real_rx: float
    model_rx: float
    real_dials: float
    model_dials: float

    @property
    def cpu_error(self) -> float:
        return self.model_cpu / self.real_cpu - 1 if self.real_cpu else float("nan")

    @property
    def rx_error(self) -> float:
        return self.model_rx / self.real_rx - 1 if self.real_rx else float("nan")


def predicted(model: Model, run: RunMetrics) -> Validation:
    """A run against `model`'s prediction at its size, with the links it held."""
    p = predict(model, run.mode, run.nodes, links=run.links)
    return Validation(run.mode, run.nodes, run.pace_cpu, p.pace_cpu, run.pace_rx, p.pace_rx, run.dials, p.dials)


def validate(runs: list[RunMetrics], groups_per_round: int, want: int) -> list[Validation]:
    """Each run against a model fitted without its size (its mode's other sizes, every idle
    phase but its own); links are the run's own, as a node would know them."""
    out = []
    for run in runs:
        rest = [r for r in runs if r.nodes != run.nodes]
        if not any(r.mode == run.mode for r in rest):
            continue
        out.append(predicted(fit(rest, groups_per_round, want), run))
    return out


def authors_a_round(groups: float, groups_per_author: int) -> float:
    """Distinct authors behind a round's `groups` when each drawn author sends that many."""
    return math.ceil(groups / groups_per_author) if groups_per_author > 1 else groups


def uniform_authors(nodes: int, per_round: float, rounds: int) -> float:
    """Distinct authors heard in `rounds` rounds when each round brings `per_round` groups from
    distinct authors drawn uniformly from the other N - 1: (N-1) (1 - (1 - k/(N-1))^R)."""
    others = nodes - 1
    return others * (1 - (1 - min(per_round, others) / others) ** rounds)


def simulate_authors(nodes: int, want: int, rounds: int, links: int, seed: int = 0, trials: int = 20) -> float:
    """Distinct authors over `rounds` rounds when the draw is over discovery's table (TABLE_MAX
    records, least recently refreshed dropped first) and `links` connections, the table taking
    RECORDS_PER_ASK records of random peers every DISCOVERY_INTERVAL_S (make run's round is
    PACE_ROUND_S): the reach of the rule when the swarm outgrows the table."""
    rng = random.Random(seed)
    asks_per_round = PACE_ROUND_S / DISCOVERY_INTERVAL_S
    total = 0
    for _ in range(trials):
        table: dict[int, None] = dict.fromkeys(rng.sample(range(1, nodes), min(TABLE_MAX, nodes - 1)))
        linked = rng.sample(range(1, nodes), min(links, nodes - 1))
        heard: set[int] = set()
        owed = 0.0
        for _ in range(rounds):
            owed += asks_per_round
            while owed >= 1:
                owed -= 1
                for peer in rng.sample(range(1, nodes), min(RECORDS_PER_ASK, nodes - 1)):
                    table.pop(peer, None)
                    table[peer] = None  # refreshed: now the most recent
                while len(table) > TABLE_MAX:
                    del table[next(iter(table))]
            pool = list(set(table) | set(linked))
            heard.update(rng.sample(pool, min(want, len(pool))))
        total += len(heard)
    return total / trials
