"""A message that makes py-libp2p raise inside `push_msg` costs the peer that sent it, like the
other transport-level refusals (`malformed_message`, 10 points): ten of them are a ban."""

import trio
from libp2p.pubsub.pubsub import Pubsub

from sapo.protocol.peers.peer_guard import BAN_SCORE, PENALTIES
from tests.support.gossip import start_node, wait_for_mesh


async def test_peer_whose_messages_make_libp2p_raise_is_charged_then_banned(monkeypatch):
    original = Pubsub.push_msg
    poisoned: set[bytes] = set()

    async def raising_push_msg(self, msg_forwarder, msg):
        # Stands in for whatever hostile input makes libp2p's own push_msg raise (a bug we
        # have not met yet); only the attacker's messages, and only in the victim, take it.
        if self.my_id.to_bytes() in poisoned and msg.from_id not in poisoned:
            raise ValueError("libp2p choked on this message")
        return await original(self, msg_forwarder, msg)

    monkeypatch.setattr(Pubsub, "push_msg", raising_push_msg)
    offences = int(-BAN_SCORE / PENALTIES["malformed_message"])  # 10
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            victim = await start_node(nursery, discover_peers=0)
            attacker = await start_node(nursery, peers=[victim.addr], discover_peers=0)
            await wait_for_mesh([victim, attacker])
            poisoned.add(victim.service.my_id.to_bytes())
            attacker_id = attacker.service.my_id.to_bytes()

            assert await attacker.service.publish(b"bad 0")
            with trio.fail_after(5):
                while victim.counters.get("malformed_message", 0) == 0:
                    await trio.sleep(0.02)
            # Charged to the directly connected peer that sent it (here also its author).
            assert victim.service.policy.guard.score(attacker_id) <= -PENALTIES["malformed_message"] + 1
            assert not victim.counters.get("peers_banned")

            for i in range(1, offences + 2):
                assert await attacker.service.publish(b"bad %d" % i)
                await trio.sleep(0.02)
            with trio.fail_after(10):
                while not victim.counters.get("peers_banned"):
                    await trio.sleep(0.05)
                while attacker.service.peer_id in victim.service.connected_peers():
                    await trio.sleep(0.05)
            assert victim.counters["malformed_message"] >= offences
            assert victim.service.status().bans == [attacker.service.peer_id]
            assert victim.inbox.statistics().current_buffer_used == 0  # nothing was delivered
            nursery.cancel_scope.cancel()
