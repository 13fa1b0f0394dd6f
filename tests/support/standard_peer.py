"""A standard libp2p peer that nobody here wrote, as its own process: py-libp2p's own host,
GossipSub and Circuit Relay v2 client, used as the library documents them, publishing real
RolloutGroup frames (the real codec) on a sapo topic.

It speaks what any gossipsub peer speaks (Noise, yamux, identify, ping, /meshsub/1.0.0-1.2.0)
and nothing of sapo's: no /sapo/peers/1 discovery, no AutoNAT dial-backs. It dials each of
`--peers` once (retrying until the first success, as a start-up script would) and, like a
standard host, never dials a circuit again on its own. With `{"reserve": "<relay multiaddr>"}`
in --settings it holds a slot on that relay, so it can be reached through it.

Its command line and event lines are bench/gossip_peer.py's (`up`, `pub`, `recv`, `state`),
so `bench.gossip_peer.PeerProcess(..., module=STANDARD_PEER)` runs and reads it. --settings takes
`swarm` (the topic's swarm name, default "bench") and `reserve`.
"""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import time
from pathlib import Path

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service

from bench.gossip_peer import parse_args

STANDARD_PEER = "tests.support.standard_peer"  # run as `python -m`, from the repository root
FIRST_DIAL_SECONDS = 60.0


def frames(groups_file: Path, peer_id: str, swarm: str):
    """Real RolloutGroup frames of the groups in `groups_file` (gossip_peer.write_groups), one per call."""
    from sapo.protocol.wire.codec import encode
    from sapo.protocol.wire.messages import to_wire
    from sapo.training.problems.rollouts import QuestionGroup
    from sapo.training.problems.tasks import reasoning_gym_version

    groups = [QuestionGroup.model_validate(g) for g in json.loads(groups_file.read_text())]
    version = reasoning_gym_version()
    k = 0
    while True:
        yield encode(
            to_wire(
                groups[k % len(groups)],
                sender=peer_id,
                swarm=swarm,
                sender_round=k,
                model_id="standard",
                created_at=time.time(),
                reasoning_gym_version=version,
            )
        )
        k += 1


async def first_dial(host, transport, address: str) -> None:
    target = multiaddr.Multiaddr(address)
    deadline = trio.current_time() + FIRST_DIAL_SECONDS
    while True:
        try:
            with trio.fail_after(15):
                if "/p2p-circuit" in address:
                    await transport.dial(target)
                else:
                    await host.connect(info_from_p2p_addr(target))
            return
        except Exception:  # noqa: BLE001 - not up yet: a start-up script tries again
            if trio.current_time() > deadline:
                raise
            await trio.sleep(1.0)


def connection_kinds(host) -> dict[str, str]:
    kinds = {}
    network = host.get_network()
    for peer in host.get_connected_peers():
        relayed = {
            "/p2p-circuit" in str(a)
            for c in network.get_connections(peer)
            if not c.is_closed
            for a in c.get_transport_addresses()
        }
        if relayed:
            kinds[peer.to_base58()] = (
                "both" if relayed == {True, False} else ("relayed" if True in relayed else "direct")
            )
    return kinds


async def peer_main(args, emit) -> None:
    options = json.loads(args.settings)
    swarm = options.get("swarm", "bench")
    topic = f"sapo/{swarm}/rollouts/1"
    listen = multiaddr.Multiaddr(args.listen)
    host = new_host(key_pair=create_new_key_pair(), listen_addrs=[listen])
    peer_id = host.get_id().to_base58()
    # Tuned as the library's notes advise: a 1 s heartbeat (its default is 120 s) that "adaptive
    # gossip" does not stretch to 30-60 s in a small swarm. Left on, the message cache spanned
    # minutes, and py-libp2p replays the cache's window to every peer that (re)subscribes: through
    # a relay with a 128 KiB circuit budget that replay alone cut each new circuit within seconds.
    router = GossipSub(
        protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11, PROTOCOL_ID],
        degree=6,
        degree_low=4,
        degree_high=12,
        heartbeat_interval=1,
        adaptive_gossip_enabled=False,
    )
    pubsub = Pubsub(host, router)
    relay_protocol = CircuitV2Protocol(host, allow_hop=False)
    transport = CircuitV2Transport(host, relay_protocol, RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT))
    counters = {"received": 0, "published": 0}
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with (
            host.run([listen]),
            background_trio_service(pubsub),
            background_trio_service(router),
            background_trio_service(relay_protocol),
            trio.open_nursery() as nursery,
        ):
            await pubsub.wait_until_ready()
            subscription = await pubsub.subscribe(topic)
            if options.get("reserve"):
                relay = info_from_p2p_addr(multiaddr.Multiaddr(options["reserve"]))
                await first_dial(host, transport, options["reserve"])
                stream = await host.new_stream(relay.peer_id, [HOP_PROTOCOL_ID])
                assert await transport.reserve(stream, relay.peer_id, nursery), "the relay refused a reservation"
            for address in args.peers:
                await first_dial(host, transport, address)
            emit(ev="up", peer_id=peer_id, listen=[str(a) for a in host.get_addrs()])

            async def receive() -> None:
                from sapo.protocol.wire.codec import DecodeLimits, Rejected, decode

                while True:
                    message = await subscription.get()
                    sender = ID(message.from_id).to_base58()
                    if sender == peer_id:
                        continue
                    try:
                        decode(message.data, DecodeLimits())
                    except Rejected:
                        emit(ev="rejected", sender=sender)
                        continue
                    counters["received"] += 1
                    emit(ev="recv", id=hashlib.sha1(message.data).hexdigest(), sender=sender, at=time.time())

            async def report() -> None:
                while True:
                    emit(ev="state", conns=connection_kinds(host), counters=dict(counters))
                    await trio.sleep(args.state_seconds)

            async def publish() -> None:
                if args.rate <= 0 or args.groups_file is None:
                    return
                if args.wait_go:
                    line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
                    _, at, seconds = line.split()
                    args.publish_at, args.publish_seconds = float(at), float(seconds)
                await trio.sleep(max(0.0, (args.publish_at or time.time()) - time.time()))
                stop_at = time.monotonic() + (args.publish_seconds or float("inf"))
                next_at = time.monotonic()
                for frame in frames(args.groups_file, peer_id, swarm):
                    if time.monotonic() >= stop_at:
                        return
                    sent = time.time()
                    await pubsub.publish(topic, frame)  # py-libp2p's publish never says whether it went out
                    counters["published"] += 1
                    emit(ev="pub", id=hashlib.sha1(frame).hexdigest(), at=sent, ok=True)
                    next_at += 1.0 / args.rate
                    await trio.sleep(max(0.0, next_at - time.monotonic()))

            nursery.start_soon(receive)
            nursery.start_soon(report)
            nursery.start_soon(publish)
            async for _ in signals:
                emit(ev="stopping")
                nursery.cancel_scope.cancel()
                break
        with trio.move_on_after(5):
            await host.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with open(args.events, "a", buffering=1) as events:  # line-buffered: the parent sees each event

        def emit(**fields) -> None:
            events.write(json.dumps({"t": time.time(), **fields}) + "\n")

        trio.run(peer_main, args, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
