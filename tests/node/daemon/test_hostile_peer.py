"""A running node, over real libp2p, refuses each kind of bad group with its named reason
and keeps training."""

import subprocess
import sys

import msgpack
import trio
from libp2p.crypto.ed25519 import create_new_key_pair

from sapo.node.core.exchange import GroupEncoder
from sapo.protocol.network import open_network
from sapo.protocol.peers.identity import peer_id_of
from sapo.protocol.settings import NetworkSettings
from sapo.training.problems.tasks import reasoning_gym_version
from tests.support.groups import honest_group
from tests.support.processes import FAST_TINY, LISTEN, TOPIC_PATH, read_metrics


async def test_bad_groups_are_rejected_by_reason_while_the_node_trains(tmp_path):
    data = tmp_path / "victim"
    args = [
        sys.executable,
        "-m",
        "sapo.node.cli",
        "start",
        *FAST_TINY,
        *TOPIC_PATH,
        "--rounds",
        "0",
        "--data-dir",
        str(data),
    ]
    log = (tmp_path / "victim.log").open("w")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        with trio.fail_after(180):
            line = ""
            while not LISTEN.search(line):
                line = await trio.to_thread.run_sync(proc.stdout.readline)
                assert line or proc.poll() is None, "node exited early"
            address = LISTEN.search(line).group(1)

            key = create_new_key_pair(b"\x07" * 32)
            attacker_id = peer_id_of(key)
            send, receive = trio.open_memory_channel(100)
            # a larger limit than the victim's, so the oversized message does get sent
            # and on the topic, as the victim: a fetching node publishes there only for older releases
            attacker_settings = NetworkSettings(
                listen="/ip4/127.0.0.1/tcp/0", peers=[address], max_message_bytes=600 * 1024, exchange="gossip"
            )
            encoder = GroupEncoder(
                peer_id=attacker_id, swarm="default", model_id="evil", rg_version=reasoning_gym_version()
            )
            group = honest_group()
            spoofed = group.model_copy(update={"problem": group.problem.model_copy(update={"answer": "12345"})})
            impostor = GroupEncoder(
                peer_id=peer_id_of(create_new_key_pair(b"\x08" * 32)),
                swarm="default",
                model_id="evil",
                rg_version=reasoning_gym_version(),
            )
            # a config that would make us generate an enormous problem
            huge_spec = group.problem.spec.model_copy(
                update={"config": {**group.problem.spec.config, "max_digits": 10**6}}
            )
            enormous = group.model_copy(update={"problem": group.problem.model_copy(update={"spec": huge_spec})})
            honest_frame = encoder.frame(group, 1)
            bad_frames = {
                "spoofed_answer_key": encoder.frame(spoofed, 1),
                "config_out_of_range": encoder.frame(enormous, 1),
                "oversized": b"\x00" + msgpack.packb({"pad": "x" * 300_000}),
                "bad_schema": b"\x00" + msgpack.packb({"schema_version": 1, "modality": "text", "sender": attacker_id}),
                "bad_frame": b"\xde\xad\xbe\xef garbage",
                "sender_mismatch": impostor.frame(group, 1),
            }
            async with open_network(attacker_settings, key, send) as attacker:
                while not attacker.connected_peers():
                    await trio.sleep(0.2)
                await trio.sleep(2)  # a heartbeat or two for the mesh
                rounds_before = max((r["round"] for r in read_metrics(data)), default=0)
                for frame in bad_frames.values():
                    assert await attacker.publish(frame)
                assert await attacker.publish(honest_frame)  # one honest group
                await trio.sleep(1)
                assert await attacker.publish(honest_frame)  # and the same bytes again: a replay
                while True:
                    rows = read_metrics(data)
                    rejected = rows[-1]["rejected"] if rows else {}
                    expected = [*bad_frames, "duplicate"]
                    if all(rejected.get(reason) for reason in expected) and rows[-1]["accepted_from"].get(attacker_id):
                        break
                    await trio.sleep(0.5)
                # and it keeps training afterwards
                target = rows[-1]["round"] + 2
                while max(r["round"] for r in read_metrics(data)) < target:
                    await trio.sleep(0.5)
        assert proc.poll() is None, "the node died"
        assert target > rounds_before
        assert rows[-1]["accepted_from"][attacker_id] == 1  # only the honest group got in
    finally:
        proc.kill()
        proc.wait()
        log.close()
