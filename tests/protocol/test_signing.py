"""Strict signing: a peer's unsigned or wrongly signed message is dropped and counted, and
its properly signed messages still get through."""

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import PUBSUB_SIGNING_PREFIX, Pubsub

from tests.support.gossip import TOPIC, assert_empty, receive_all, start_node, wait_for_mesh


async def wait_count(counters, name, timeout=10.0):
    with trio.fail_after(timeout):
        while not counters.get(name):
            await trio.sleep(0.05)


async def test_unsigned_and_wrongly_signed_messages_are_dropped_and_counted():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            victim = await start_node(nursery)
            attacker = await start_node(nursery, peers=[victim.addr])
            await wait_for_mesh([victim, attacker])
            pubsub = attacker.service.pubsub

            pubsub.strict_signing = False  # publish without any signature
            await attacker.service.publish(b"unsigned")
            await wait_count(victim.counters, "unsigned")

            # signed, but by a key that is not the one the message names
            forged = rpc_pb2.Message(
                data=b"forged", topicIDs=[TOPIC], from_id=pubsub.my_id.to_bytes(), seqno=pubsub._next_seqno()
            )
            forged.signature = create_new_key_pair().private_key.sign(
                PUBSUB_SIGNING_PREFIX.encode() + forged.SerializeToString()
            )
            forged.key = pubsub.host.get_public_key().serialize()
            await Pubsub.push_msg(pubsub, pubsub.my_id, forged)  # past the sender's own check
            pubsub.strict_signing = True
            await wait_count(victim.counters, "bad_signature")
            assert_empty(victim)

            assert await attacker.service.publish(b"signed")
            [message] = await receive_all(victim, 1)
            assert message.data == b"signed" and message.sender == attacker.service.peer_id
            # An unsigned or forged message is never marked seen (its id names someone else's
            # sequence number, so marking it would let a stranger pre-empt that author's message).
            # The attacker's gossip may therefore offer it again, and each receipt is counted.
            assert victim.counters["unsigned"] >= 1 and victim.counters["bad_signature"] >= 1
            nursery.cancel_scope.cancel()


async def test_a_message_from_a_key_that_is_not_ed25519_is_dropped_before_its_signature_is_checked():
    """libp2p verifies any RSA key a message carries, and one with a 4,095-bit public exponent
    costs 16-32 ms a check: a node takes only Ed25519 ids (every sapo release signs with one),
    looks at nothing else of such a message, and charges nobody (an honest peer may forward it)."""
    from libp2p.crypto.rsa import create_new_key_pair as create_rsa_key_pair

    from sapo.protocol.exchange.pubsub_guards import is_ed25519_id

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            victim = await start_node(nursery)
            rsa = await start_node(nursery, peers=[victim.addr], key_pair=create_rsa_key_pair())
            await wait_for_mesh([victim, rsa])
            assert not is_ed25519_id(rsa.service.my_id.to_bytes()) and is_ed25519_id(victim.service.my_id.to_bytes())
            assert await rsa.service.publish(b"from an rsa key")
            await wait_count(victim.counters, "unsupported_key")
            assert_empty(victim)
            assert victim.service.policy.guard.score(rsa.service.my_id.to_bytes()) == 0.0  # nobody charged
            nursery.cancel_scope.cancel()
