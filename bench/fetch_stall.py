"""Stalling the fetcher (issue #41): the groups a node accepts a round, with and without authors that stall.

One trio run on 127.0.0.1. An asker runs the real network (protocol/network.py), the node's own
exchange and intake (node/core/exchange.py, node/core/intake.py) and, each round, the node's own
step (`GossipExchange.publish`, which asks for `groups_wanted(J)` groups). Its authors:

  honest   3 nodes, 2 groups with signal each a round (2 connected, 1 known by its record only);
  flat     1 node whose 2 groups a round have no signal: the intake refuses them (`no_signal`),
           so frames that came are not groups the node can train on;
  dead     (arm `dead`) 4 keys whose signed records name 8 addresses that never answer: one direct
           and 7 through relays, all on a TCP port that accepts connections and never speaks
           (on main: 10 s + 7 x 15 s of dial timeouts each);
  holding  (arm `holding`) 4 nodes, known by their records, that take a request and never answer.

Arm `both` has the dead and the holding authors; arm `flat` none of them, but 3 flat authors
instead of 1: most of what comes is refused, and only a fetcher told of refusals makes up for it.

Printed: the groups accepted in each round, their mean as a share of J (each round counted up to
J), the worst round, and what it cost the asker: requests a round and dials in all.

    .venv/bin/python -m bench.fetch_stall                  # 8 rounds of 4 s, every arm
    .venv/bin/python -m bench.fetch_stall --smoke          # 3 rounds, arms none and both

"Before" is the same script run with main's code importable as `sapo` (docs/bench/fetch-stall.md).
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from bench.text_table import print_rows
from sapo.node.core.counters import NodeCounters
from sapo.node.core.exchange import GossipExchange, GroupEncoder, groups_wanted
from sapo.node.core.intake import node_intake
from sapo.node.core.memory import NodeMemory
from sapo.node.core.node import node_inbox
from sapo.node.core.settings import load_settings
from sapo.protocol.exchange.peer_table import Source
from sapo.protocol.network import serve_network
from sapo.protocol.settings import NetworkSettings
from sapo.protocol.toolkit.hosts import reached_group
from sapo.protocol.wire.group_wire import PROTOCOL_ID
from sapo.protocol.wire.peer_records import seal_own_record
from sapo.training.problems.rewards import score_group
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs, reasoning_gym_version

SWARM = "stall"
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
J = 4
HONEST = 3
# arm: (flat authors, dead authors, holding authors)
ARMS = {"none": (1, 0, 0), "dead": (1, 4, 0), "holding": (1, 0, 4), "both": (1, 4, 4), "flat": (3, 0, 0)}
GROUPS_A_ROUND = 2  # each author's I
HOLD_AT_MOST_SECONDS = 120.0  # a holding author gives up on a stream only after this


@dataclass
class Peer:
    net: Any  # protocol/network.py's Network
    encoder: GroupEncoder


# A peer on this host that passes records on: the records below come to the asker as discovery
# would bring them, told by someone else, from loopback (where records naming loopback are kept).
TELLER = ID.from_pubkey(create_new_key_pair().public_key)


def tell(discovery: Any, envelope: bytes) -> None:
    """Have `discovery` learn a record as one a peer on this host passed on to it."""
    discovery._learn(envelope, None, Source(TELLER, reached_group("127.0.0.1")), "127.0.0.1", own=False)


def group(index: int, signal: bool) -> QuestionGroup:
    """A right group on the index-th question: one right completion and, with `signal`, one wrong."""
    problem = TaskSampler(default_task_specs(["basic_arithmetic"]), 77, 0).sample(index + 1)[index]
    right = f"<answer>{problem.answer}</answer>"
    second, reward = ("<answer>x</answer>", 0.0) if signal else (right, 1.0)
    return QuestionGroup(problem=problem, completions=[right, second], rewards=[1.0, reward])


@contextmanager
def tarpit() -> Iterator[int]:
    """A loopback TCP port that takes connections into its backlog and never reads or writes:
    a dial there waits until its own deadline."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4096)
        yield listener.getsockname()[1]


def dead_record(port: int) -> bytes:
    """A fresh key's signed record of 8 addresses, none of which answers: one direct, 7 relayed
    through relays that do not exist, all at the tarpit."""
    direct = multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")
    fake_relays = [create_new_key_pair() for _ in range(7)]
    relayed = [
        multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{port}/p2p/{_peer_id(relay)}/p2p-circuit") for relay in fake_relays
    ]
    return seal_own_record(create_new_key_pair(), [direct, *relayed])


def _peer_id(key_pair: Any) -> str:
    return ID.from_pubkey(key_pair.public_key).to_base58()


async def hold(stream: Any) -> None:
    """A holding author's `/sapo/groups/1`: read the request, never answer, until the asker gives up."""
    with trio.move_on_after(HOLD_AT_MOST_SECONDS):
        try:
            while await stream.read(1024):
                pass
        except Exception:  # noqa: BLE001 - the asker's reset ends the hold
            pass


async def start_net(nursery: trio.Nursery, peers: list[str], send: Any = None, key_pair: Any = None) -> Any:
    settings = NetworkSettings(listen=LOOPBACK, peers=peers, swarm=SWARM, exchange="fetch", discover_peers=0)
    if send is None:
        send, _ = trio.open_memory_channel[Any](1)  # an author reads nothing it is sent
    key_pair = key_pair or create_new_key_pair()
    return await nursery.start(partial(serve_network, settings, key_pair, send, counters={}))


def author(net: Any) -> Peer:
    encoder = GroupEncoder(peer_id=net.peer_id, swarm=SWARM, model_id="m", rg_version=reasoning_gym_version())
    return Peer(net, encoder)


@dataclass(frozen=True)
class SwarmRun:
    accepted: list[int]  # groups the asker accepted, each round
    rejected: dict[str, int]  # what its intake refused, by reason
    network: dict[str, int]  # its network's counters (fetch_timeouts, fetch_failed, ...)


async def run_swarm(arm: str, rounds: int, round_seconds: float) -> SwarmRun:
    """What the asker accepted in each of `rounds` rounds of `round_seconds`, in `arm`."""
    settings = load_settings({"model": "tiny", "tasks": ["basic_arithmetic"], "swarm": SWARM})
    counters = NodeCounters()
    asker_key = create_new_key_pair()
    asker_id = ID.from_pubkey(asker_key.public_key).to_base58()
    # built before any network: the intake imports reasoning-gym, which holds the loop for a second
    intake = node_intake(settings, counters, peer_id=asker_id, rg_version=reasoning_gym_version(), verifier=score_group)
    memory = NodeMemory(node_inbox(settings), intake, counters)
    with tarpit() as port:
        async with trio.open_nursery() as nursery:
            flats, deads, holders = ARMS[arm]
            honest = [author(await start_net(nursery, [])) for _ in range(HONEST)]
            flat = [author(await start_net(nursery, [])) for _ in range(flats)]
            holding = [await start_net(nursery, []) for _ in range(holders)]
            for net in holding:
                net.host.set_stream_handler(PROTOCOL_ID, hold)
            send, receive = trio.open_memory_channel[Any](256)
            bootstrap = [p.net.listen_addrs[0] for p in (*honest[:2], *flat)]
            asker = await start_net(nursery, bootstrap, send, asker_key)
            for net in (honest[2].net, *holding):  # known by their records only: dialled to be asked
                tell(asker.discovery, net.discovery.own_record())
            for _ in range(deads):
                tell(asker.discovery, dead_record(port))
            with trio.fail_after(20):
                while len(asker.connected_peers()) < len(bootstrap):
                    await trio.sleep(0.05)
            exchange = GossipExchange(asker, author(asker).encoder, memory, groups_wanted(J))
            nursery.start_soon(exchange.receive, receive)
            accepted = []
            for round_index in range(rounds):
                start = trio.current_time()
                for n, peer in enumerate([*honest, *flat]):
                    for i in range(GROUPS_A_ROUND):
                        index = (round_index * 16 + n) * GROUPS_A_ROUND + i
                        frame = peer.encoder.frame(group(index, signal=peer in honest), round_index)
                        await peer.net.share(frame, round_index)
                before = counters.accepted
                await exchange.publish([], round_index)  # the node's round step: nothing of ours, then want
                await trio.sleep_until(start + round_seconds)
                accepted.append(counters.accepted - before)
            nursery.cancel_scope.cancel()
    return SwarmRun(accepted, dict(counters.rejected), dict(asker.counters))


def share_of_j(accepted: list[int]) -> float:
    """The mean of each round's accepted groups, each counted up to J, as a share of J."""
    return sum(min(n, J) for n in accepted) / (J * len(accepted))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--round-seconds", type=float, default=4.0)
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--smoke", action="store_true", help="3 rounds, arms none and both")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.smoke:
        args.rounds, args.arms = 3, ["none", "both"]
    rows = [["arm", "accepted per round", f"mean / J (J={J})", "worst round", "requests / round", "dials"]]
    for arm in args.arms:
        run = trio.run(run_swarm, arm, args.rounds, args.round_seconds)
        requests = run.network.get("fetch_requests", 0) / args.rounds
        accepted = " ".join(map(str, run.accepted))
        dials = str(run.network.get("fetch_dials", 0))
        rows.append(
            [arm, accepted, f"{share_of_j(run.accepted):.2f}", str(min(run.accepted)), f"{requests:.1f}", dials]
        )
    print_rows(rows)


if __name__ == "__main__":
    main()
